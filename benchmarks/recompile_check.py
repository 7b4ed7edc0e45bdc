"""Do compiled decoder layers compile again when packed blocks bring a new document count or longest document?

The native engine compiles each decoder layer (`layer.compile()`, inductor) on a GPU. Blocks have one length, but
their document count (`cu_seq_lens`' length) and longest document (`max_length`) change from step to step; passed
as plain values a compiled layer specialises on each until it has changed once, so a layer structure compiles
again whenever one first changes, mid-run too. `runner.train.attention.packing_kwargs(..., lengths_as_shapes=True)`
(what the varlen path uses) passes both as sizes marked dynamic. This runs the same blocks through two Llama-3.2-3B
layers (varlen, torch's kernel, bf16), one half recomputed inside its compiled forward as train.recompute_layers
does, with the lengths as plain values and as shapes, and prints per step the seconds and graphs compiled so far.

    python3 benchmarks/recompile_check.py --out $OUT          # on a GPU
    python3 benchmarks/recompile_check.py --device cpu --backend aot_eager --dtype float32 --tokens 512 --out /tmp/rc
    (the second: its logic on CPU, small widths, flash-attn-4's custom op around the tests' float64 stand-in)

Blocks: three alike, then a new longest document, then a new count, then varied (the order that recompiled late).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ORDER = [(6, 2000), (6, 2000), (6, 2000), (6, 3000), (8, 3000), (4, 5000), (7, 1500), (5, 2500), (9, 1200),
         (3, 6000)]
"""(documents, longest document) per step, at 8,192 tokens; scaled to --tokens."""


def blocks(tokens: int, vocab: int) -> list[dict]:
    import torch

    from runner.train.blocks import make_block
    from runner.train.data import collate

    g = torch.Generator().manual_seed(0)
    out = []
    for count, longest in ORDER:
        longest = max(2, longest * tokens // 8192)
        rest = (tokens - longest) // (count - 1)
        lengths = [longest] + [rest] * (count - 2) + [tokens - longest - rest * (count - 2)]
        ids = torch.randint(3, vocab, (tokens,), generator=g).tolist()
        starts = [sum(lengths[:i]) for i in range(count)]
        out.append(collate([make_block(ids, [True] * tokens, starts, tokens, 0)]))
    return out


def model(device: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from runner.train import fa4
    from runner.train.attention import register_varlen, set_varlen_kernel

    widths = dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=24, num_key_value_heads=8,
                  head_dim=128)
    if device == "cpu":  # the kernel's custom op around the tests' float64 stand-in for flash-attn-4; small widths
        from tests.unit.test_fa4_varlen import _stand_in

        fa4._interface = lambda: _stand_in({"fwd": 0, "bwd": 0})
        register_varlen()
        set_varlen_kernel(fa4.varlen_attn)
        widths = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16)
    else:
        register_varlen("torch")
    cfg = LlamaConfig(num_hidden_layers=2, vocab_size=1024, tie_word_embeddings=True, **widths)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="varlen",
                                            dtype=getattr(torch, dtype)).to(device)


def run(as_shapes: bool, args: argparse.Namespace) -> dict:
    import torch
    from torch._dynamo.utils import counters

    import runner.train.loss as loss
    from runner.train.data import to_device
    from runner.train.apply import enable_recompute
    from runner.train.model import decoder_layers

    torch._dynamo.reset()
    counters.clear()
    m = model(args.device, args.dtype)
    enable_recompute(m, 1, inside_compile=True)
    for layer in decoder_layers(m):
        layer.compile(backend=args.backend)
    loss.uses_varlen = lambda _model: as_shapes  # the one switch: lengths as plain values or as shapes
    steps = []
    for batch in blocks(args.tokens, 1024):
        batch = to_device(batch, args.device)
        start = time.perf_counter()
        total = loss.full_loss_sum(m, batch)
        total.backward()
        if args.device == "cuda":
            torch.cuda.synchronize()
        steps.append({"docs": int(batch["cu_seqlens"].numel() - 1), "longest": int(batch["max_len"]),
                      "s": round(time.perf_counter() - start, 3), "graphs": counters["stats"]["unique_graphs"],
                      "loss": float(total)})
        print(json.dumps({"lengths_as_shapes": as_shapes, **steps[-1]}), flush=True)
    return {"lengths_as_shapes": as_shapes, "steps": steps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokens", type=int, default=8192)
    args = ap.parse_args()
    import torch

    results = [run(True, args), run(False, args)]
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    out = {"command": " ".join(sys.argv), "device": name, "torch": torch.__version__, "runs": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "recompile-check.json").write_text(json.dumps(out, indent=1))
    for r in results:
        s = r["steps"]
        print(f"lengths as shapes={r['lengths_as_shapes']}: graphs after step 1 {s[0]['graphs']}, at the end "
              f"{s[-1]['graphs']}; steps after the first: {sum(x['s'] for x in s[1:]):.2f} s "
              f"(slowest {max(x['s'] for x in s[1:]):.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
