"""Tiled MLP (train.tiled_mlp): the tile size, what one layer's MLP keeps for backward, and whether `auto` tiles.

One rule for the engine (runner.train.tiling runs the tiles) and the estimator (runner.plan.activations counts
them). No torch here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from runner.engines import ENGINES, engine_for
from runner.errors import Problem
from runner.facts.catalog import LAYER_LINEAR, Arch
from runner.facts.families import family


LEVER = "train.tiled_mlp"
NORM_TILE_FACTOR = 2
"""A recomputed RMSNorm's tiles (runner.train.tiling.recompute_norm) hold as many elements as this many MLP tiles
of the hidden state: a norm is cheap per element, so fewer, larger tiles (a Python loop runs per tile)."""
NORM_BACKWARD_BYTES = 24
"""Bytes per element of a tile that an RMSNorm's backward holds at its peak: six fp32 tensors (the upcast input,
its square, the normalised product and their gradients; measured with a live-bytes tracker, tests/unit/
test_tiled_mlp.py)."""


def mlp_tile_tokens(arch: Arch, tokens: int) -> int:
    """Tokens per MLP tile: the hidden size (as Snowflake's ALST recipe does). A tile's intermediates are then
    about intermediate × hidden elements, a few of the layer's own MLP weights, whatever the block length; shorter
    tiles would only add kernel launches."""
    return max(1, min(tokens, arch.hidden))


def mlp_intermediate_bytes(arch: Arch, i: int, b: int) -> float:
    """Bytes per token that layer i's MLP keeps for backward besides its input, in the compute dtype of b bytes,
    counted from the HF implementation (the norm output it reads is counted with the norm)."""
    if arch.is_moe_layer(i):
        e_im, k, h = arch.expert_intermediate, arch.experts_per_token, arch.hidden
        n = b * arch.num_experts  # router logits
        # Per route: the gathered input, the expert intermediates and the expert output the routing weight
        # multiplies (transformers' grouped_mm experts path).
        fam = family(arch.model_type)
        n += k * b * ((fam.expert_intermediates if fam is not None else 4) * e_im + 2 * h)
        if arch.shared_expert_intermediate:
            n += 4 * b * arch.shared_expert_intermediate + 2 * b
        return n
    return 4 * b * arch.intermediate  # silu input, silu output, up, their product (down_proj's input)


def mlp_backward_width(arch: Arch) -> int:
    """The widest gradient an MLP's backward makes, in elements per token."""
    return arch.intermediate if not arch.num_experts else 2 * arch.expert_intermediate * arch.experts_per_token


def attention_bytes(arch: Arch, i: int, b: int) -> float:
    """What layer i's token mixer keeps per token, roughly (the kernel's q, k, v and output; a gated-delta layer's
    projections): what the MLP's intermediates are weighed against for `auto`."""
    if arch.layer_type(i) == LAYER_LINEAR:
        return b * (2 * (2 * arch.linear_key_dim + arch.linear_value_dim) + 4 * arch.linear_value_dim)
    return b * (2 * arch.q_dim + 2 * arch.kv_dim)


def flash_backward_workspace_bytes(arch: Arch) -> float:
    """Per token, what FlashAttention-2's varlen backward (torch's varlen kernel) allocates beside the q, k and v
    gradients: dq accumulated in fp32 (4 bytes × q_dim; plus 128 rows per document, not counted), and with fewer
    KV heads than query heads the k and v gradients of every query head, in bf16, before they are summed per KV head
    (2 × 2 bytes × q_dim). On an H100 the Qwen3-4B layout's tiled layers ran out of memory asking
    for exactly these two (benchmarks/long-blocks-h200/; the sizes in benchmarks/README.md)."""
    return 4 * arch.q_dim + (4 * arch.q_dim if arch.kv_heads < arch.heads else 0)


HEAD_GROUPS_WHEN_SHARE = 1 / 16
"""A tiled layer's attention differentiates one KV-head group at a time when the flash kernel's backward workspace
for the whole block would take more than this share of the GPU (as TILE_WHEN_SHARE weighs the MLP's)."""


def attention_head_groups(arch: Arch, tiled: bool, attn: str, device: str, tokens: int, gpu_bytes: float) -> int:
    """KV-head groups a tiled layer's varlen attention runs its backward in (runner.train.head_groups): every KV head
    on its own where the flash kernel's workspace (`flash_backward_workspace_bytes`) over the block would exceed
    HEAD_GROUPS_WHEN_SHARE of the GPU (of `gpu_bytes`), at the price of one more attention forward a layer; else 1,
    the kernel's own backward. One rule for the engine and the estimator."""
    if not (tiled and attn == "varlen" and device == "cuda" and arch.kv_heads > 1 and gpu_bytes):
        return 1
    if flash_backward_workspace_bytes(arch) * tokens <= HEAD_GROUPS_WHEN_SHARE * gpu_bytes:
        return 1
    return arch.kv_heads


@dataclass(frozen=True)
class TiledMlp:
    on: bool
    tile_tokens: int
    reason: str


TILE_WHEN_SHARE = 1 / 16
"""`auto` tiles when one layer's MLP intermediates over the whole block would take more than this share of the
GPU's memory: there they (and their gradients, as large again) are a part of the peak that the block length
scales, at short blocks a negligible one that tiling would only slow down."""


def tiled_mlp_choice(setting: bool | str, engine: str, device: str, arch: Arch, tokens: int, gpu_bytes: float = 0.0,
                     compile_layers: bool = False) -> TiledMlp:
    """Whether the MLP runs in tiles, and how long they are. `auto` tiles with the native engine on a GPU (of
    `gpu_bytes`), eager layers, when the MLP's intermediates are what grows at a layer's backward: they outweigh the
    layer's attention per token and one layer's of them, for the block, exceed TILE_WHEN_SHARE of the GPU. CPU runs
    stay untiled (their recipes' loss curves are exact references)."""
    tile = mlp_tile_tokens(arch, tokens)
    if setting is True:
        return TiledMlp(True, tile, f"on (train.tiled_mlp=true): tiles of {tile:,} tokens, RMSNorms recomputed")
    if setting is False:
        return TiledMlp(False, tile, "off (train.tiled_mlp=false)")
    if not engine_for(engine).honours(LEVER) or device != "cuda" or compile_layers:
        return TiledMlp(False, tile, "off (auto): tiles run in the native engine's eager layers on a GPU")
    mlp, rest = _largest_mlp_and_attention(arch)
    if mlp <= rest:
        return TiledMlp(False, tile, "off (auto): attention, not the MLP, keeps the most of a layer")
    share = mlp * tokens / gpu_bytes if gpu_bytes else 0.0
    if share <= TILE_WHEN_SHARE:
        return TiledMlp(False, tile, f"off (auto): one layer's MLP intermediates take {100 * share:.1f}% of the GPU")
    return TiledMlp(True, tile, f"on (auto): one layer's MLP intermediates would take {100 * share:.0f}% of the GPU; "
                                f"tiles of {tile:,} tokens, RMSNorms recomputed")


@functools.lru_cache(maxsize=64)  # per model; the planner decides hundreds of candidates of one
def _largest_mlp_and_attention(arch: Arch) -> tuple[float, float]:
    """The largest layer's MLP intermediates and attention bytes per token, in bf16."""
    b = 2
    return (max(mlp_intermediate_bytes(arch, i, b) for i in range(arch.layers)),
            max(attention_bytes(arch, i, b) for i in range(arch.layers)))


def tiled_mlp_problems(engine: str, setting: bool | str, compile_layers: bool) -> list[Problem]:
    """train.tiled_mlp=true needs the native engine's eager decoder layers (refused before launch)."""
    why = fix = ""
    if setting is True and not engine_for(engine).honours(LEVER):
        able = " or ".join(f"engine={e.name}" for e in ENGINES.values() if e.honours(LEVER))
        why, fix = engine_for(engine).lacks[LEVER], f"use {able}"
    elif setting is True and compile_layers:
        why, fix = "a tiled MLP runs eagerly; train.compile compiles whole layers", "set train.compile=false"
    return [Problem("train.tiled_mlp", why, f"{fix}, or train.tiled_mlp=auto")] if why else []
