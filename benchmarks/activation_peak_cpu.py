"""What grows with the block, measured on CPU: the peak of live bytes per token of a whole model's training step,
against the estimator's count, for the long-block settings (tiled MLP and RMSNorms, every layer recomputed and its
attention too, fused loss, bf16).

The model is the Llama-3.1-8B or Qwen3-4B layout with every width an eighth (head size kept) and 4 layers, with the
layout's vocabulary and tying. A TorchDispatchMode (`LiveBytes`) tracks every storage an op makes and frees (a storage's Python
object lives as long as its memory), counting only tensors with a dimension of the block's length (or one fewer), so
the weights, the loss's chunk of logits and the embedding's gradient drop out; the peak of that over the step, at
two block lengths, gives bytes per token as a slope. The estimator's count is the slope of its allocated peak
between two long blocks on a GPU plan (where the per-token part decides the peak phase), with the layer inputs
kept on the GPU, as here (no offload on CPU). CPU SDPA at these lengths runs its flash kernel, which keeps what a
varlen kernel keeps.

    python3 benchmarks/activation_peak_cpu.py                 # both layouts, a few minutes on 2 cores
    python3 benchmarks/activation_peak_cpu.py --only llama --show   # and the tensors alive at the peak
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import checkpoint

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EIGHTH = {"llama": dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=1, head_dim=128,
                        intermediate_size=1792, vocab_size=128256, tie_word_embeddings=False),
          "qwen3": dict(hidden_size=320, num_attention_heads=4, num_key_value_heads=1, head_dim=128,
                        intermediate_size=1216, vocab_size=151936, tie_word_embeddings=True)}
LAYERS = 4
BLOCKS = (4096, 8192)


class LiveBytes(TorchDispatchMode):
    """Live bytes of the storages ops make under this mode, their peak, and what was alive then; with `tokens`,
    only those of tensors that grow with a block of that many tokens (a dimension of it, or one fewer). Also used
    by tests/unit/test_tiled_mlp.py."""

    def __init__(self, tokens: int | None = None) -> None:
        super().__init__()
        self.sizes = None if tokens is None else (tokens, tokens - 1)
        self.live = self.peak = 0
        self.alive: dict[int, tuple] = {}
        self.at_peak: dict[int, tuple] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and (self.sizes is None or any(d in self.sizes for d in t.shape)):
                storage = t.untyped_storage()
                ptr, n = storage.data_ptr(), storage.nbytes()
                if n and ptr not in self.alive:
                    self.alive[ptr] = (str(func).removeprefix("aten."), tuple(t.shape), str(t.dtype)[6:], n)
                    self.live += n
                    weakref.finalize(storage, self._free, ptr, n)
                    if self.live > self.peak:
                        self.peak, self.at_peak = self.live, dict(self.alive)
        return out

    def _free(self, ptr: int, n: int) -> None:
        self.alive.pop(ptr, None)
        self.live -= n


def build(layout: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    from runner.train.tiling import recompute_outer_norms, tile_layers

    config = AutoConfig.for_model(layout, num_hidden_layers=LAYERS, **EIGHTH[layout])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    layers = list(model.model.layers)
    tile_layers(layers, config.hidden_size)
    recompute_outer_norms(model, layers, config.hidden_size)
    for layer in layers:  # every layer recomputed, as train.recompute_layers=null does
        layer.forward = functools.partial(lambda f, *a, **k: checkpoint(f, *a, use_reentrant=False, **k), layer.forward)
    return model


def measured(model: torch.nn.Module, tokens: int, vocab: int) -> LiveBytes:
    from runner.train.loss import fused_loss_sum

    ids = torch.randint(0, min(vocab, 500), (1, tokens), generator=torch.Generator().manual_seed(tokens))
    mode = LiveBytes(tokens)
    with mode:
        fused_loss_sum(model, {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(tokens)[None]}).backward()
    model.zero_grad(set_to_none=True)
    return mode


def counted(layout: str) -> float:
    """The estimator's bytes per token at its peak phase (the slope of its allocated peak over two long blocks)."""
    from transformers import AutoConfig

    from runner.plan import estimate
    from runner.spec import load_spec

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = AutoConfig.for_model(layout, num_hidden_layers=LAYERS, **EIGHTH[layout])
        (folder / "config.json").write_text(json.dumps({**config.to_dict(), "torch_dtype": "bfloat16"}))
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            (folder / f).write_bytes((ROOT / "recipes/embedded/tokenizer" / f).read_bytes())
        sets = [f"model.path={folder}", "model.id=bench/eighth", "model.init=random", "model.dtype=bfloat16",
                "hardware.gpu=H100-80GB", "hardware.nproc_per_node=1", "train.compile=false",
                "train.activation_checkpointing=true", "train.recompute_layers=null", "train.recompute_attention=true",
                "train.offload_activations=false", "train.tiled_mlp=true", "train.loss_impl=fused"]
        lengths = (262144, 524288)
        peaks = [estimate(load_spec("qwen3-4b-bench-h200", [*sets, f"train.seq_len={n}"]), suggest=False)
                 .per_gpu_allocated_gib for n in lengths]
    return (peaks[1] - peaks[0]) * 2**30 / (lengths[1] - lengths[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(EIGHTH))
    ap.add_argument("--show", action="store_true", help="list the tensors alive at the peak")
    args = ap.parse_args()
    print("| layout (1/8 width, 4 layers) | measured bytes per token | estimator | error |")
    print("| --- | --- | --- | --- |")
    for layout in [args.only] if args.only else sorted(EIGHTH):
        model = build(layout)
        small, large = (measured(model, n, EIGHTH[layout]["vocab_size"]) for n in BLOCKS)
        per_token = (large.peak - small.peak) / (BLOCKS[1] - BLOCKS[0])
        count = counted(layout)
        print(f"| {layout} | {per_token:,.0f} | {count:,.0f} | {count / per_token - 1:+.1%} |", flush=True)
        if args.show:
            for name, shape, dtype, n in sorted(large.at_peak.values(), key=lambda d: -d[3]):
                print(f"    {name} {shape} {dtype}: {n / BLOCKS[1]:,.0f} B/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
