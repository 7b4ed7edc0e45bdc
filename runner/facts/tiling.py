"""Tiled MLP (train.tiled_mlp): the tile size, what one layer's MLP keeps for backward, and whether `auto` tiles.

One rule for the engine (runner.train.tiling runs the tiles) and the estimator (runner.plan.activations counts
them). No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.facts.catalog import LAYER_LINEAR, Arch
from runner.facts.families import family


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


@dataclass(frozen=True)
class TiledMlp:
    on: bool
    tile_tokens: int
    reason: str


def tiled_mlp_choice(setting: bool | str, engine: str, device: str, arch: Arch, tokens: int,
                     compile_layers: bool = False) -> TiledMlp:
    """Whether the MLP runs in tiles, and how long they are. `auto` tiles with the native engine on a GPU, eager
    layers, when the block holds more than one tile and one layer's MLP intermediates outweigh the rest of what the
    layer keeps (its attention): then they are what bounds the block length at a layer's backward. CPU runs stay
    untiled (their recipes' loss curves are exact references)."""
    tile = mlp_tile_tokens(arch, tokens)
    if setting is True:
        return TiledMlp(True, tile, f"on (train.tiled_mlp=true): tiles of {tile:,} tokens")
    if setting is False:
        return TiledMlp(False, tile, "off (train.tiled_mlp=false)")
    if engine != "native" or device != "cuda" or compile_layers:
        return TiledMlp(False, tile, "off (auto): tiles run in the native engine's eager layers on a GPU")
    if tokens <= tile:
        return TiledMlp(False, tile, f"off (auto): the block ({tokens:,} tokens) is one tile")
    b = 2
    mlp = max(mlp_intermediate_bytes(arch, i, b) for i in range(arch.layers))
    rest = max(attention_bytes(arch, i, b) for i in range(arch.layers))
    if mlp <= rest:
        return TiledMlp(False, tile, "off (auto): attention, not the MLP, keeps the most of a layer")
    return TiledMlp(True, tile, f"on (auto): the MLP keeps {mlp / rest:.1f}× what attention does per token; "
                                f"tiles of {tile:,} tokens")
