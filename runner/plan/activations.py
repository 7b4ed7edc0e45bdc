"""Activations: the bytes one decoder layer keeps for backward, per token."""

from __future__ import annotations

from runner.facts.catalog import LAYER_LINEAR, Arch
from runner.decide.rules import ULYSSES
from runner.facts.families import family
from runner.facts.tiling import (
    NORM_BACKWARD_BYTES,
    NORM_TILE_FACTOR,
    flash_backward_workspace_bytes as flash_backward_workspace_bytes,  # the estimator reads it here
    mlp_backward_width,
    mlp_intermediate_bytes,
)
from runner.plan.constants import (
    ACTIVATION_CALIBRATION,
    GDN_CHUNK,
    GDN_TORCH_PATH_BYTES,
    NORM_UPCAST_BYTES,
)


def _norm_bytes(arch: Arch, b: int, frozen: bool, recomputed: bool = False) -> tuple[int, int]:
    """(bytes per element an RMSNorm keeps for backward besides its output, the output's bytes).

    HF's RMSNorm keeps its fp32 copy of the input (pow and the rsqrt product save it) and, only when its weight
    trains, the normalised tensor the weight multiplies: bf16 in llama-style norms (`weight * x.to(bf16)`), fp32
    where the product is taken before the cast (gpt-oss, qwen3_next, qwen3_5: `(x * w).to(bf16)`). The output is
    kept by the linears that read it (their weight's gradient, or LoRA's lora_A). `recomputed` (a tiled layer's
    norms, runner.train.tiling): the norm keeps only its input, in the compute dtype. Not counted either way: the
    fp32 reciprocal root per row (4 bytes a token, against thousands).
    """
    if recomputed:
        return b, b
    up = max(b, NORM_UPCAST_BYTES)  # fp32 runs: the input itself is what is kept
    fam = family(arch.model_type)
    cast = up if fam is not None and fam.fp32_norm_product else b
    return up + (0 if frozen else cast), b


def layer_activation_bytes(arch: Arch, i: int, attn: str, b: int, seq_len: int, frozen: bool = False,
                           gdn_torch: bool = False, tiled: bool = False) -> float:
    """Tensors one decoder layer keeps for backward, per token, counted from the HF implementation.

    `frozen`: LoRA, the base weights take no gradient, so the tensors kept only for a weight's gradient are not
    kept (the norms' normalised input). Rotary embeddings keep nothing per token: cos and sin need no gradient,
    so `q * cos` keeps cos, not q. `tiled`: the MLP runs in tiles (train.tiled_mlp) and keeps only its input;
    its intermediates are a tile's, counted once per layer by `tile_bytes`; its norms are recomputed.
    """
    h = arch.hidden
    norm_kept, norm_out = _norm_bytes(arch, b, frozen, recomputed=tiled)
    n = 2 * (norm_kept + norm_out) * h  # input and post-attention RMSNorm
    kind = arch.layer_type(i)
    if kind == LAYER_LINEAR:
        kd, vd, vh = arch.linear_key_dim, arch.linear_value_dim, arch.linear_value_heads
        conv = 2 * kd + vd
        rep = max(1, vh // max(1, arch.linear_key_heads))
        n += b * conv * 2  # projection output (saved by the conv) and the conv + silu output
        n += b * vd  # z gate
        n += b * 2 * kd * rep  # q, k repeated to the value heads
        n += 4 * 2 * vh  # g and beta (fp32)
        n += b * vh * GDN_CHUNK  # the chunk kernel's within-chunk matrix
        n += b * vd  # kernel output
        # Gated RMSNorm: fp32 copy (in fp32 runs that is the kernel output itself), normalised output, silu(z).
        n += ((NORM_UPCAST_BYTES if b < NORM_UPCAST_BYTES else 0) + 2 * b) * vd
        n += b * vd  # out_proj input
        if gdn_torch:
            n += GDN_TORCH_PATH_BYTES * vd
    else:
        q, kv = arch.q_dim, arch.kv_dim
        if arch.qk_norm:
            n += norm_kept * (q + kv)  # the q/k norms' output goes to rotary, which keeps nothing of it
        # Ulysses runs SDPA after its exchange, on a rank's heads over the whole block: as many elements as its
        # tokens over all heads, so counted per token like SDPA.
        explicit = attn in ("sdpa", "eager", ULYSSES)
        kv_saved = q if explicit else kv  # repeat_kv materialises k, v at the query heads for these two
        n += b * (q + 2 * kv_saved)  # rotated q and k, and v, kept by the kernel
        n += b * q + 4 * arch.heads  # kernel output (o_proj reads a view of it) and logsumexp (fp32)
        if attn == "eager":
            n += b * q  # eager's output is transposed and made contiguous: o_proj keeps the copy
        if arch.attn_output_gate:
            n += 2 * b * q  # sigmoid(gate) and the gated o_proj input
        if attn == "eager":
            n += b * arch.heads * (seq_len + (1 if arch.attention_sinks else 0))  # softmax probabilities
    if not tiled:  # a tiled MLP keeps only its input (the norm output counted above)
        n += mlp_intermediate_bytes(arch, i, b)
    return n * ACTIVATION_CALIBRATION


def backward_transient_bytes(arch: Arch, b: int, tiled: bool = False, workspace: float = 0.0,
                             head_groups: int = 1) -> float:
    """Gradient tensors alive at once inside one layer's backward, per token. Tiled, the MLP's widest gradient and
    the RMSNorms' fp32 backward are a tile's (`tile_bytes`): what grows with the block is the attention's backward,
    its q, k and v gradients beside the hidden state's gradients in and out (measured: tests/unit/
    test_tiled_mlp.py) and the attention kernel's own `workspace` per token (`flash_backward_workspace_bytes`).
    In `head_groups` (runner.train.head_groups) the kernel runs on one group at a time: its workspace is a group's,
    beside that group's recomputed output and log-sum-exp, its contiguous q, k, v and output-gradient slices and its
    q, k, v gradients before they are copied into the whole's."""
    if tiled and not arch.linear_key_dim:
        if head_groups > 1:
            group = workspace + b * (4 * arch.q_dim + 4 * arch.kv_dim) + 4 * arch.heads
            return b * (2 * arch.hidden + arch.q_dim + 2 * arch.kv_dim) + group / head_groups
        return b * (2 * arch.hidden + arch.q_dim + 2 * arch.kv_dim) + workspace
    widest = max(0 if tiled else mlp_backward_width(arch), 2 * arch.linear_key_dim + arch.linear_value_dim,
                 2 * arch.q_dim)
    return b * (2 * arch.hidden + 2 * widest)


def tile_bytes(arch: Arch, b: int, tile_tokens: int) -> float:
    """The larger of one MLP tile at its backward (the recomputed tile's intermediates and its gradients) and one
    RMSNorm tile's fp32 backward (runner.train.tiling: NORM_TILE_FACTOR MLP tiles' worth of hidden-state
    elements, q/k norms' too), in bytes for the whole tile."""
    mlp = max((mlp_intermediate_bytes(arch, i, b) for i in range(arch.layers)), default=0.0) * tile_tokens \
        * ACTIVATION_CALIBRATION + 2 * b * mlp_backward_width(arch) * tile_tokens
    return max(mlp, NORM_BACKWARD_BYTES * NORM_TILE_FACTOR * tile_tokens * arch.hidden)
