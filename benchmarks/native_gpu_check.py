"""Throughput, MFU and peak memory of the native engine's training step on one GPU, plus a bf16 packing check.

On the H200 (offline; torch and transformers as installed there, no datasets/pydantic needed):

    python benchmarks/native_gpu_check.py --out $OUT/native.json            # full: ~6 min
    python benchmarks/native_gpu_check.py --quick --out $OUT/native.json    # 8,192 tokens only, fewer steps

Anywhere (no GPU): `--dry-run` builds the configs on the meta device and prints the plan and the FLOP counts.

What runs: random-init models built from configs in this file, the engine's own pieces (runner.train:
attention choice and registration, per-document reset for gated-delta layers, FSDP2 sharding with bf16 params and
fp32 reduction, non-reentrant activation checkpointing, chunked loss, fused AdamW, `native.train_step`) on
synthetic packed blocks of documents 400-3,000 tokens long (uniform, seeded), every token but each document's first
a target. Each row: `--warmup` steps, then `--steps` timed steps, each bracketed by torch.cuda.synchronize();
tokens/s = block tokens / median step time.

FLOPs per step: model FLOPs + attention FLOPs as runner/facts/flops.py names them (the references.md convention, no
recompute counted), so its MFU is the MFU of `runner bench` and of the record:
    6 · N · T  +  6 · Σ_attention layers (heads · head_dim) · Σ_documents L_d²
N = parameters that multiply activations: all of them, minus the input embedding when it is not tied to the
LM head (a lookup, not a matmul); T = tokens in the block. The second term is causal softmax attention: per layer
and document, QKᵀ and PV cost 2 · 2 · L² · (heads · head_dim) forward without a mask, half of it causal, times 3 for
forward + backward. Gated-delta (linear attention) layers add only their projections (in N): their O(L · chunk)
state work is not counted. MFU = FLOPs / (median step s × 790e12), 790 TFLOP/s being the H200's measured bf16
matmul ceiling.

Packing check: a 2-layer model of each family in bf16, a packed block of 4 documents through the attention the
engine picks (and varlen when available) vs the same documents one at a time (sdpa): max relative error of the
per-document loss sums and of the logits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from runner.versions import package_versions  # noqa: E402 - after the path setup above

PEAK_FLOPS = 790e12
DOC_MIN, DOC_MAX = 400, 3000
VERSIONS = ("torch", "transformers", "triton", "flash-linear-attention", "causal-conv1d", "flash-attn")


# ---------------------------------------------------------------------------------------------
# Models


def qwen3_1_7b_config() -> Any:
    """The reference figures' 1.72B Qwen3 architecture."""
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=151_936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def qwen3_5_hybrid_config() -> Any:
    """The reduced 27B-family language tower of recipes/qwen3.5-hybrid-reduced-h200.yaml (text-only)."""
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(vocab_size=248_320, hidden_size=2048, intermediate_size=6144, num_hidden_layers=16,
                             num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                             linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                             layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 4,
                             max_position_embeddings=65_536, tie_word_embeddings=False)


def tiny(config: Any) -> Any:
    """Two layers of the same family for the packing check."""
    types = getattr(config, "layer_types", None) or []
    small = ["linear_attention", "full_attention"] if "linear_attention" in types else ["full_attention"] * 2
    return config.__class__(**{**config.to_dict(), "num_hidden_layers": 2, "layer_types": small})


MODELS = {"qwen3-1.7b": qwen3_1_7b_config, "qwen3.5-hybrid-reduced": qwen3_5_hybrid_config}


def matmul_params(model: Any) -> int:
    """N of the 6·N·T term: every parameter, minus an input embedding that is not the LM head's weight."""
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight is not emb:
        total -= emb.numel()
    return total


def attention_width(config: Any) -> tuple[int, int]:
    """(full softmax-attention layers, heads · head_dim)."""
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    n = sum(1 for t in types if t in ("full_attention", "sliding_attention"))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return n, config.num_attention_heads * head_dim


def step_flops(n_params: int, tokens: int, attn_layers: int, attn_width: int, doc_lengths: list[int]) -> float:
    """Model FLOPs (6·N per token) + attention FLOPs (6 · width · Σ L² per layer), runner/facts/flops.py's quantities."""
    return 6.0 * n_params * tokens + 6.0 * attn_layers * attn_width * float(sum(d * d for d in doc_lengths))


def document_lengths(seq_len: int, seed: int) -> list[int]:
    """Documents of 400-3,000 tokens filling exactly seq_len (the last one cut to fit, as packing does)."""
    import random

    rng = random.Random(seed)
    out: list[int] = []
    while sum(out) < seq_len:
        out.append(min(rng.randint(DOC_MIN, DOC_MAX), seq_len - sum(out)))
    return out


def packed_batch(seq_len: int, vocab: int, seed: int) -> tuple[dict[str, Any], list[int]]:
    import torch

    from runner.train.data import collate, make_block

    lengths = document_lengths(seq_len, seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (seq_len,), generator=g).tolist()
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return collate([make_block(ids, [True] * seq_len, starts, seq_len, 0)]), lengths


# ---------------------------------------------------------------------------------------------
# Timing


def init_process_group() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("nccl", rank=0, world_size=1)


def build(config: Any, attn: str, compile_layers: bool) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from runner.train.attention import VARLEN, install_document_reset, register_varlen
    from runner.train.loss import attach_chunked_loss
    from runner.train.apply import enable_recompute
    from runner.train.model import decoder_layers, disable_cache

    if attn == VARLEN:
        register_varlen()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation=attn)
    disable_cache(model)
    install_document_reset(model)
    enable_recompute(model, None, inside_compile=compile_layers)
    for layer in decoder_layers(model) if compile_layers else ():
        layer.compile()  # one GPU, bf16 weights: the plain module, as the engine trains it
    model.train()
    attach_chunked_loss(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
    return model, opt


def measure(name: str, config: Any, seq_len: int, attn: str, warmup: int, steps: int, compile_layers: bool,
            ) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from runner.train.attention import available_kernels, choose_attention, concrete_model_class, supported_attention
    from runner.train.data import to_device
    from runner.train.native import train_step

    chosen = choose_attention(attn, "cuda", seq_len,
                              supported_attention(concrete_model_class(AutoModelForCausalLM, config)), config,
                              available_kernels("cuda"))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    row: dict[str, Any] = {"engine": "native", "model": name, "seq_len": seq_len, "attn": chosen.impl,
                           "attn_reason": chosen.reason, "activation_checkpointing": True, "loss_impl": "chunked",
                           "compile": compile_layers}
    try:
        model, opt = build(config, chosen.impl, compile_layers)
        n_params = matmul_params(model)
        layers, width = attention_width(config)
        times = []
        for i in range(warmup + steps):
            batch, _ = packed_batch(seq_len, config.vocab_size, seed=i)
            n_targets = int(batch["target_ids"].numel())
            batch = to_device(batch, "cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss, grad_norm = train_step(model, opt, [batch], n_targets, 1, "chunked", 1.0)
            torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        step_s = statistics.median(times)
        flops = statistics.mean(step_flops(n_params, seq_len, layers, width, document_lengths(seq_len, i))
                                for i in range(warmup, warmup + steps))
        row.update(params=n_params, step_s=round(step_s, 4), step_s_all=[round(t, 4) for t in times],
                   tokens_per_s=round(seq_len / step_s, 1), tflops=round(flops / step_s / 1e12, 1),
                   mfu=round(flops / step_s / PEAK_FLOPS, 4), final_loss=round(float(loss) / n_targets, 4),
                   grad_norm=round(float(grad_norm), 4),
                   peak_alloc_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
                   peak_reserved_gib=round(torch.cuda.max_memory_reserved() / 2**30, 2))
        del model, opt
    except Exception as e:  # noqa: BLE001 - one failing row (OOM, missing kernel) must not lose the others
        row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        row["peak_alloc_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------------------------------------
# bf16 packing check on the GPU


def packing_check(name: str, config: Any, attn: str) -> dict[str, Any]:
    import copy
    import functools

    import torch
    from transformers import AutoModelForCausalLM

    from runner.train import attention
    from runner.train.attention import (
        VARLEN,
        choose_attention,
        concrete_model_class,
        install_document_reset,
        register_varlen,
        supported_attention,
    )
    from runner.train.data import collate, make_block, to_device
    from runner.train.loss import chunked_loss_sum
    from runner.train.model import disable_cache

    cfg = tiny(config)
    calls: list[int] = []
    if attention.varlen_available():
        real = attention._torch_varlen_kernel()

        @functools.wraps(real)
        def counting(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            return real(*args, **kwargs)

        attention.set_varlen_kernel(counting)
    chosen = choose_attention(attn, "cuda", 8192,
                              supported_attention(concrete_model_class(AutoModelForCausalLM, cfg)), cfg,
                              attention.available_kernels("cuda")).impl
    if chosen == VARLEN:
        register_varlen()
    torch.manual_seed(0)
    # One config object each: from_config records the attention choice on the config it is given, and the model
    # reads it at every forward.
    with torch.device("cuda"):
        packed_model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), dtype=torch.bfloat16,
                                                        attn_implementation=chosen)
        single_model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), dtype=torch.bfloat16,
                                                        attn_implementation="sdpa")
    single_model.load_state_dict(packed_model.state_dict())
    for m in (packed_model, single_model):
        disable_cache(m)  # with a cache transformers skips the packed-sequence mask
    install_document_reset(packed_model)
    lengths = [700, 1500, 410, 2900]
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in lengths]
    seq_len = sum(lengths) + (-sum(lengths)) % 8
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    ids = [t for d in docs for t in d]
    batch = to_device(collate([make_block(ids, [True] * len(ids), starts, seq_len, 0)]), "cuda")
    with torch.no_grad():
        packed_logits = packed_model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False,
                                     cu_seq_lens_q=batch["cu_seqlens"], cu_seq_lens_k=batch["cu_seqlens"],
                                     max_length_q=batch["max_len"], max_length_k=batch["max_len"],
                                     seq_idx=batch["seq_idx"]).logits[0].float()
        packed_loss = float(chunked_loss_sum(packed_model, batch))
        single_logits, single_loss = [], 0.0
        for d in docs:
            b = to_device(collate([make_block(d, [True] * len(d), [0], len(d), 0)]), "cuda")
            b = {k: v for k, v in b.items() if k not in ("cu_seqlens", "seq_idx")}
            single_logits.append(single_model(input_ids=b["input_ids"], use_cache=False).logits[0].float())
            single_loss += float(chunked_loss_sum(single_model, b))
    ref = torch.cat(single_logits)
    got = packed_logits[: ref.shape[0]]
    attention.set_varlen_kernel(None)
    return {"model": name, "attn": chosen, "attn_loaded": packed_model.config._attn_implementation,
            "varlen_kernel_calls": len(calls), "dtype": "bfloat16", "documents": lengths,
            "loss_rel_err": abs(packed_loss - single_loss) / abs(single_loss),
            "logits_max_rel_err": float((got - ref).abs().max() / ref.abs().max()),
            "logits_mean_abs_err": float((got - ref).abs().mean())}


# ---------------------------------------------------------------------------------------------


def versions() -> dict[str, str | None]:
    return package_versions(VERSIONS)


def dry_run(seq_lens: list[int]) -> dict[str, Any]:
    """Configs on the meta device and the FLOPs the timed rows would count (no GPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    rows = []
    for name, make in MODELS.items():
        config = make()
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        n = matmul_params(model)
        layers, width = attention_width(config)
        for seq_len in seq_lens:
            lengths = document_lengths(seq_len, 0)
            rows.append({"model": name, "seq_len": seq_len, "params": n, "attention_layers": layers,
                         "attention_width": width, "documents": len(lengths),
                         "flops_per_step": step_flops(n, seq_len, layers, width, lengths)})
    return {"dry_run": True, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "native.json")
    p.add_argument("--quick", action="store_true", help="8,192 tokens only, 1 warm-up + 3 timed steps")
    p.add_argument("--dry-run", action="store_true", help="no GPU: configs on meta, FLOP counts, the plan")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--seq-lens", default="8192,32768")
    p.add_argument("--attn", default="auto", help="comma-separated attention backends per row (auto picks)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="torch.compile each decoder layer")
    p.add_argument("--no-check", action="store_true", help="skip the bf16 packing check")
    p.add_argument("--check-only", action="store_true", help="only the bf16 packing check, no timed rows")
    args = p.parse_args(argv)
    seq_lens = [8192] if args.quick else [int(x) for x in args.seq_lens.split(",")]
    if args.quick:
        args.warmup, args.steps = 1, 3
    result: dict[str, Any] = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
                              "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "versions": versions(), "flops": "6*N*T + 6*sum_attn_layers(heads*head_dim)*sum_docs(L^2)",
                              "peak_flops": PEAK_FLOPS}
    if args.dry_run:
        result.update(dry_run(seq_lens))
    else:
        import torch

        init_process_group()
        result["gpu"] = torch.cuda.get_device_name()
        names = [m for m in args.models.split(",") if m]
        result["packing_check"] = []
        for name in ([] if args.no_check else names):
            for attn in ("auto", "varlen"):
                try:
                    result["packing_check"].append(packing_check(name, MODELS[name](), attn))
                except Exception as e:  # noqa: BLE001 - report and go on
                    result["packing_check"].append({"model": name, "attn": attn, "error": f"{type(e).__name__}: {e}"})
        rows = []
        for name in ([] if args.check_only else names):
            for seq_len in seq_lens:
                for attn in args.attn.split(","):
                    row = measure(name, MODELS[name](), seq_len, attn, args.warmup, args.steps, args.compile)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        result["rows"] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
