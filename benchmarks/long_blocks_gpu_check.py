"""The two long-block mechanisms on one GPU, before any long probe: attention one KV-head group at a time
(runner/train/head_groups.py) and layer inputs regenerated in backward from host memory (runner/train/regenerate.py).

    python3 benchmarks/long_blocks_gpu_check.py --out $OUT      # about a minute on an H100 or H200

1. **Exact.** A Qwen3-4B-shaped model cut to 4 layers (bf16, varlen attention through the run's kernel, tiled MLP
   and norms, every layer recomputed, random init), one packed block of real-length conversations: the loss and
   every gradient with (a) the layers' inputs in host memory, one of them regenerated and one on the GPU
   (`offload_layers=1`: places source, regenerated, GPU, GPU) and (b) the attention in KV-head groups, against the
   same model with every input kept on the GPU and the kernel's own backward. Regeneration should be bit for bit;
   the groups to bf16 rounding.
2. **Memory.** One attention call's backward at 65,536 tokens (the 4B's 32 query and 8 KV heads of 128): the peak
   allocated above what was live before it, whole and in 8 groups; the estimator says 8 bytes × q_dim a token of
   workspace whole (2 GiB here) and one group's share in groups.

Writes `long-blocks-gpu-check.json` to --out and prints it; exits 1 when (1) is not exact or (2) is not smaller.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.facts.catalog import parse_arch  # noqa: E402
from runner.facts.tiling import flash_backward_workspace_bytes  # noqa: E402
from runner.train import attention  # noqa: E402
from runner.train.apply import enable_recompute  # noqa: E402
from runner.train.model import text_decoder_layers  # noqa: E402
from runner.train.apply import set_head_groups  # noqa: E402
from runner.train.tiling import tile_layers  # noqa: E402


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
QWEN3_4B = ROOT / "recipes" / "embedded" / "qwen3-4b"


def _use_kernel(kernel: str) -> None:
    """The run's varlen kernel; `reference` (per-document sdpa, any device) checks this script itself on CPU."""
    if kernel == "reference":
        attention.set_varlen_kernel(attention.reference_varlen_attn)
        attention.register_varlen()
    else:
        attention.register_varlen(kernel)


def _model(kernel: str, layers: int = 4) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(QWEN3_4B)
    config.num_hidden_layers = layers
    config.layer_types = ["full_attention"] * layers
    config.initializer_range = 0.2  # wide weights: a wrong input moves the loss
    config.use_cache = False
    if DEVICE == "cpu":  # this script's own check: the vocabulary is what makes a CPU step slow
        config.vocab_size = 4096
    _use_kernel(kernel)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_config(config, attn_implementation="varlen", dtype=dtype)
    tile_layers(text_decoder_layers(model), config.hidden_size)
    return model.to(DEVICE)


def _batch(vocab: int, tokens: int) -> dict[str, torch.Tensor]:
    """One block of documents of 1,300, 4,000, 700 and the rest tokens (LIMA-like lengths), as the engine packs it."""
    g = torch.Generator().manual_seed(1)
    lengths = [n for n in (1300, 4000, 700) if n < tokens // 2][:2] or [tokens // 4]
    lengths.append(tokens - sum(lengths))
    ids = torch.randint(3, vocab, (tokens,), generator=g)
    positions = torch.cat([torch.arange(n) for n in lengths])
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return {"input_ids": ids[None].to(DEVICE), "position_ids": positions[None].to(DEVICE),
            "cu_seq_lens_q": cu.to(DEVICE), "cu_seq_lens_k": cu.to(DEVICE), "max_length_q": max(lengths),
            "max_length_k": max(lengths)}


def _loss_and_grads(model: torch.nn.Module, batch: dict) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logits = model(**batch).logits.float()
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], batch["input_ids"][0, 1:])
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def exactness(kernel: str, tokens: int) -> dict:
    base = _model(kernel, 2 if DEVICE == "cpu" else 4)
    batch = _batch(base.config.vocab_size, tokens)
    plain = copy.deepcopy(base).train()
    enable_recompute(plain, None)
    ref_loss, ref = _loss_and_grads(plain, batch)
    out: dict = {"tokens": tokens, "loss": ref_loss}
    for name, groups, offload in (("regenerated", 1, True), ("head_groups", 8, False)):
        model = copy.deepcopy(base).train()
        # Host memory on a GPU (runner.train.offload); on CPU the source's input stays where it is.
        enable_recompute(model, None, offload=offload and DEVICE == "cuda", offload_layers=1, regenerate=offload)
        set_head_groups(text_decoder_layers(model), groups)
        loss, grads = _loss_and_grads(model, batch)
        rel = max(float((grads[n] - ref[n]).abs().max() / ref[n].abs().max().clamp_min(1e-30)) for n in ref)
        out[name] = {"loss": loss, "loss_diff": abs(loss - ref_loss), "max_rel_grad_diff": rel,
                     "bit_for_bit": loss == ref_loss and all(torch.equal(grads[n], ref[n]) for n in ref)}
    return out


def attention_backward_peak(kernel: str, tokens: int, groups: int) -> int:
    _use_kernel(kernel)
    fn, _ = attention._varlen_choice()
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(tokens, 32, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k, v = (torch.randn(tokens, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
            for _ in range(2))
    cu = torch.tensor([0, tokens // 2, tokens], dtype=torch.int32, device="cuda")
    params = attention._kernel_params(fn)
    extra: dict = {"is_causal": True} if "window_size" not in params else {"window_size": (-1, 0)}
    if "enable_gqa" in params:
        extra["enable_gqa"] = True
    else:  # as the run's attention does on a torch whose varlen_attn takes no enable_gqa (2.11)
        k, v = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
    from runner.train.head_groups import attend_in_groups

    out = attend_in_groups(lambda a, b, c: fn(a, b, c, cu, cu, tokens // 2, tokens // 2, **extra), groups, q, k, v)
    grad = torch.randn_like(out)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out.backward(grad)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--kernel", default="torch",
                    help="the varlen kernel: torch (FlashAttention-2), flash-attn-4, or reference (per-document sdpa: "
                         "checks this script on CPU, exactness only, 2 layers and 2,048 tokens)")
    args = ap.parse_args()
    cpu = DEVICE == "cpu"
    if cpu and args.kernel != "reference":
        print("no GPU here: --kernel reference checks this script on CPU", file=sys.stderr)
        return 2
    result = {"device": torch.cuda.get_device_name() if not cpu else "cpu", "torch": torch.__version__,
              "kernel": args.kernel, "exactness": exactness(args.kernel, 2048 if cpu else 8192)}
    print(json.dumps(result["exactness"], indent=2), flush=True)  # kept even if the memory part fails
    whole = grouped = 0
    if not cpu:
        tokens = 65536
        whole, grouped = (attention_backward_peak(args.kernel, tokens, g) for g in (1, 8))
        from transformers import AutoConfig

        ws = flash_backward_workspace_bytes(parse_arch(AutoConfig.from_pretrained(QWEN3_4B).to_dict()))
        result["attention_backward_peak"] = {"tokens": tokens, "whole_gib": whole / 2**30,
                                             "groups_8_gib": grouped / 2**30,
                                             "estimated_workspace_whole_gib": ws * tokens / 2**30}
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "long-blocks-gpu-check.json").write_text(json.dumps(result, indent=2) + "\n")
    ex = result["exactness"]
    ok = ex["regenerated"]["bit_for_bit"] and ex["head_groups"]["max_rel_grad_diff"] < 2e-2 and grouped <= whole
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
