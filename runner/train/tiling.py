"""Tiled MLP (train.tiled_mlp): each decoder layer's MLP runs over the block in tiles of tokens, and its RMSNorms
are recomputed in backward (`tile_layers`).

Forward runs the MLP tile by tile under no_grad and keeps only its input; backward recomputes each tile with grad
and calls autograd on it, so the parameter gradients accumulate into the parameters' own `.grad` through the
normal path (FSDP2's unsharded parameters, LoRA's adapters) and the input's gradient is written tile by tile. The
MLP's intermediates are then one tile's at a time, in forward and in backward, instead of the whole block's.

The MLP maps each token on its own (dense MLPs, and MoE blocks whose router picks experts per token), so a tile's
result is the block's result for those tokens: the loss and the gradients are the untiled ones up to the order of
floating-point sums. The inner autograd call starts from a detached tile, so it never reaches the layer's inputs:
FSDP2's per-layer hooks fire once, from the outer backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from runner.facts.catalog import in_vision_part
from runner.facts.tiling import NORM_TILE_FACTOR


def tiled_rows(mlp: Any, tile: int, x: torch.Tensor) -> Any:
    """mlp(x) without gradients, `tile` rows of x at a time: what TiledRowsFunction's forward computes, and what a
    forward without gradients (evaluation, a regenerated layer input) runs, so that both give the same bits."""
    hidden: torch.Tensor | None = None
    extras = []
    start = 0
    with torch.no_grad():
        for part in x.split(tile):
            out = mlp(part.unsqueeze(0))
            if isinstance(out, tuple):  # gpt_oss returns (hidden, router scores); the layer drops the scores
                extras.append(out[1:])
                out = out[0]
            out = out.squeeze(0)
            if hidden is None:  # written tile by tile: the tiles and a concatenation of them were the block twice
                hidden = out.new_empty(len(x), *out.shape[1:])
            hidden[start:start + len(part)] = out
            start += len(part)
    assert hidden is not None
    if not extras:
        return hidden
    return (hidden, *(torch.cat(e) if isinstance(e[0], torch.Tensor) else e[0] for e in zip(*extras, strict=True)))


class TiledRowsFunction(torch.autograd.Function):
    """out = mlp(x), computed over `tile` rows of x (tokens × hidden) at a time: any module that maps each row on
    its own (the MLPs, and the RMSNorms of `recompute_norm`). `params` are the MLP's trainable
    parameters, passed so that the output requires grad whenever one of them does (a frozen input, LoRA adapters
    inside the MLP); their gradients come from the inner autograd call, not from this function's return."""

    @staticmethod
    def forward(ctx: Any, mlp: Any, tile: int, x: torch.Tensor, *params: torch.Tensor) -> Any:
        ctx.mlp, ctx.tile = mlp, tile
        ctx.save_for_backward(x)
        out = tiled_rows(mlp, tile, x)
        if isinstance(out, tuple):
            ctx.mark_non_differentiable(*(r for r in out[1:] if isinstance(r, torch.Tensor)))
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, *_: Any) -> Any:
        (x,) = ctx.saved_tensors
        grad_x = torch.empty_like(x) if ctx.needs_input_grad[2] else None
        start = 0
        for part, grad_part in zip(x.split(ctx.tile), grad_out.split(ctx.tile), strict=True):
            leaf = part.detach().requires_grad_(grad_x is not None)
            with torch.enable_grad():
                out = ctx.mlp(leaf.unsqueeze(0))
                out = (out[0] if isinstance(out, tuple) else out).squeeze(0)
            # Parameter gradients accumulate into .grad here, tile after tile, as in an untiled backward.
            torch.autograd.backward(out, grad_part)
            if grad_x is not None:
                grad_x[start:start + len(part)] = leaf.grad
            start += len(part)
        return (None, None, grad_x) + (None,) * (len(ctx.needs_input_grad) - 3)


def tile_mlp(mlp: nn.Module, tile: int) -> None:
    """Make `mlp`'s forward run in tiles of `tile` tokens (over batch × sequence, flattened)."""
    forward = mlp.forward

    def tiled_forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # an MLP called with more than its input is not one this knows how to tile
            return forward(hidden_states, *args, **kwargs)
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, shape[-1])
        # The parameters as the MLP sees them now: FSDP2 swaps unsharded ones in for the layer's forward.
        params = tuple(p for p in mlp.parameters() if p.requires_grad)
        out = TiledRowsFunction.apply(forward, tile, flat, *params)
        if isinstance(out, tuple):
            return (out[0].view(shape), *out[1:])
        return out.view(shape)

    mlp.forward = tiled_forward


MLP_NAMES = ("mlp", "block_sparse_moe", "feed_forward")
"""What transformers' decoder layers call their MLP or MoE block (`mlp` in most; GraniteMoE's `block_sparse_moe`,
Llama 4's and the LFM2 family's `feed_forward`)."""


def layer_mlp(layer: nn.Module) -> nn.Module | None:
    """The decoder layer's MLP (or MoE block), by the names its family gives it; None where it has none."""
    return next((m for name in MLP_NAMES if isinstance(m := getattr(layer, name, None), nn.Module)), None)


def tile_mlps(layers: list[nn.Module], tile: int) -> int:
    """Tile the MLP of every decoder layer that has one (`layer_mlp`); returns how many were tiled."""
    n = 0
    for layer in layers:
        mlp = layer_mlp(layer)
        if mlp is not None:
            tile_mlp(mlp, tile)
            n += 1
    return n


def recompute_norm(norm: nn.Module, tile_elements: int) -> None:
    """Make `norm` keep only its input for backward, and recompute itself there in tiles of about `tile_elements`
    elements (whole rows). HF's RMSNorm otherwise keeps an fp32 copy of its input and the normalised tensor its
    weight multiplies (6 bytes per element in bf16, against the input's 2), and its backward holds six fp32 tensors
    of its input's size at once (24 bytes an element: for Qwen3's q norm, over every query head, 96 KB a token at
    the 4B's width). An RMSNorm maps each row (its last dimension) on its own, so tiles of rows give the whole's
    result, and its backward's fp32 tensors are a tile's."""
    forward = norm.forward

    def recomputed(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return forward(hidden_states, *args, **kwargs)
        shape = hidden_states.shape
        params = tuple(p for p in norm.parameters() if p.requires_grad)
        rows = max(1, tile_elements // shape[-1])
        flat = hidden_states.reshape(-1, shape[-1])
        if not torch.is_grad_enabled():  # the same tiles: the same bits as with gradients, and no block-long fp32 copy
            return tiled_rows(forward, rows, flat).view(shape)
        return TiledRowsFunction.apply(forward, rows, flat, *params).view(shape)

    norm.forward = recomputed


def is_rms_norm(module: nn.Module) -> bool:
    """An RMSNorm module as transformers' families name them (Llama-, Qwen-, Gemma-style), itself holding no
    modules; gated variants (a second input) are not."""
    return type(module).__name__.endswith("RMSNorm") and not any(True for _ in module.children())


def recompute_norms(norms: list[nn.Module], tile: int) -> None:
    """`recompute_norm` each of `norms` with tiles of as many elements as NORM_TILE_FACTOR MLP tiles of the hidden
    state (the widest norm weight among them): a q/k norm, whose rows are heads, takes as many tokens' heads as
    that makes."""
    hidden = max((m.weight.numel() for m in norms if isinstance(getattr(m, "weight", None), torch.Tensor)), default=1)
    for norm in norms:
        recompute_norm(norm, NORM_TILE_FACTOR * tile * hidden)


def recompute_outer_norms(model: nn.Module, layers: list[nn.Module], tile: int) -> int:
    """The RMSNorms of the model outside its decoder layers (the final norm before the loss), recomputed in tiles
    as the layers' are (`tile_layers`): untiled, the final norm's backward, six fp32 copies of the block's hidden
    states, became the step's peak once the layers' were tiled. Returns how many."""
    inside = {id(m) for layer in layers for m in layer.modules()}
    outer = [m for name, m in model.named_modules()
             if is_rms_norm(m) and id(m) not in inside and not in_vision_part(name)]
    recompute_norms(outer, tile)
    return len(outer)


def tile_layers(layers: list[nn.Module], tile: int) -> int:
    """train.tiled_mlp on: every decoder layer's MLP in tiles of `tile` tokens and its RMSNorms (the q/k norms of
    its attention included) recomputed in backward, so what grows with the block in a layer is its attention's and
    its norms' inputs (runner.plan.activations counts it). Returns how many MLPs were tiled."""
    for layer in layers:
        recompute_norms([m for m in layer.modules() if is_rms_norm(m)], tile)
    return tile_mlps(layers, tile)
