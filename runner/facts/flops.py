"""FLOPs of a training step, by name, and the utilisations they give against a GPU's matmul ceiling.

Three quantities, named the same in the estimator, `runner bench`, the record and docs/estimate.md:

- **model FLOPs**: 6·N per token (forward 2·N, backward 4·N), N the active matmul parameters without the input
  embedding (a lookup, no matmul).
- **attention FLOPs**: the score and value matmuls of the full-attention layers, forward and backward, causal (half
  the square): 6 · q_width · Σ doc_len² per layer.
- **hardware FLOPs**: what the GPU runs: model FLOPs less the weight gradients LoRA's frozen weights skip, plus the
  forward that checkpointed layers run again, plus attention in the form the kernel runs it (the whole square for
  eager or masked sdpa, sliding windows, gated-delta chunks).

**MFU** = (model + attention FLOPs) / (time × ceiling); **HFU** = hardware FLOPs / (time × ceiling). The ceiling is
the GPU's practical bf16 matmul rate (`GpuType.ceiling_tflops` in runner/facts/gpus.py), not the datasheet peak.
"""

from __future__ import annotations

from typing import Any

from runner.facts.catalog import LAYER_FULL, LAYER_LINEAR, LAYER_SLIDING

GDN_CHUNK = 64
"""Chunk length of the gated-delta-rule kernels (flash-linear-attention chunk_gated_delta_rule)."""


def model_flops_per_token(arch: Any) -> float:
    """Model FLOPs per trained token: 6·N."""
    return 6.0 * arch.params_flops


def full_attention_layers(arch: Any) -> int:
    return sum(1 for i in range(arch.layers) if arch.layer_type(i) == LAYER_FULL)


def attention_flops_per_doc_len_sq(arch: Any) -> float:
    """Attention FLOPs per unit of Σ doc_len² (multiply by the step's sum of squared document lengths)."""
    return 6.0 * full_attention_layers(arch) * arch.q_dim


def hardware_flops(arch: Any, *, tokens: int, seq_len: int, doc_len: int, lora: bool, recomputed: int,
                   not_recomputed_params: int, attn: str, packing: bool,
                   attention_share: float | None = None) -> tuple[float, float]:
    """(hardware FLOPs of `tokens` trained tokens, the attention part of it).

    `recomputed`: decoder layers that run their forward again in backward; `not_recomputed_params`: matmul
    parameters per token of those layers that the recompute skips (a compiled layer's MLP output projection);
    `attention_share`: the share of layers whose backward runs their attention again (those recomputed, unless
    they kept the attention's outputs; None: every recomputed layer's)."""
    share = recomputed / max(1, arch.layers)  # of the layers' forward, again
    n_flops = arch.params_flops
    if lora:
        # Frozen weights: forward + input gradients only (no weight gradients); adapters are negligible.
        per_token = (4 + 2 * share) * n_flops
    else:
        per_token = (6 + 2 * share) * n_flops
    per_token -= 2 * not_recomputed_params
    # Attention: forward, two backward matmuls' worth, and the recompute where it runs again.
    passes = 3 + (share if attention_share is None else attention_share)
    d = max(1, min(doc_len, seq_len))
    # Eager attention computes the whole score matrix of each sequence; sdpa does too when a packed block needs a
    # dense mask. Without packing a sequence is one document.
    square = attn == "eager" or (attn == "sdpa" and packing)
    square_len = seq_len if packing else d
    attn_per_token = 0.0
    for i in range(arch.layers):
        kind = arch.layer_type(i)
        if kind == LAYER_LINEAR:
            vh, dk, dv = arch.linear_value_heads, arch.linear_key_head_dim, arch.linear_value_head_dim
            attn_per_token += passes * 2 * vh * (4 * dk * dv + GDN_CHUNK * (dk + dv))
            continue
        q = arch.q_dim
        if square:
            attn_per_token += passes * 4 * square_len * q
        else:
            span = d
            if kind == LAYER_SLIDING and arch.sliding_window:
                span = min(d, arch.sliding_window)
            causal = 0.5 if span == d else 1.0
            attn_per_token += passes * 4 * span * q * causal
    return (per_token + attn_per_token) * tokens, attn_per_token * tokens


def utilisation(flops: float, seconds: float, ceiling_tflops: float, gpus: int = 1) -> float:
    """FLOPs done in `seconds` on `gpus` GPUs as a share of their ceiling: MFU for model + attention FLOPs, HFU for
    hardware FLOPs."""
    return flops / (seconds * ceiling_tflops * 1e12 * gpus)
