"""`apply(model, decisions)`: the native engine's memory and speed mechanisms put on a loaded model in one place and
one order, as the run's decisions say (runner.decide): MLP tiles, each decoder layer's recompute plan (where its
input waits: on the GPU, in host memory, regenerated; whether attention outputs are kept), KV-head groups,
compiled layers, then FSDP2."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from runner.decide.decisions import KEPT, Decisions, LayerPlan
from runner.facts.gpus import HOSTED, REGENERATED, SOURCE


def apply(model: nn.Module, decisions: Decisions) -> nn.Module:
    """The model as the decisions run it (returned: FSDP2 wraps it in place). Tiles go on before checkpointing and
    FSDP2 wrap the layers; each layer's checkpoint region is set before its compilation sees it."""
    from runner.train.model import decoder_layers, text_decoder_layers

    layers = text_decoder_layers(model)
    if len(layers) != len(decisions.layers):
        raise RuntimeError(f"the decisions plan {len(decisions.layers)} decoder layers; the model has {len(layers)}")
    if decisions.tiled_mlp:
        from runner.train.tiling import recompute_outer_norms, tile_layers

        tile_layers(layers, decisions.mlp_tile_tokens)
        recompute_outer_norms(model, layers, decisions.mlp_tile_tokens)
    set_head_groups(layers, decisions.head_groups)
    # A compiled layer holds its checkpoint inside its graph, except where offload's saved-tensor hooks must run
    # around an eager checkpoint (transformers' wrapper then stays).
    install_recompute(model, decisions.layers, inside_compile=decisions.compile and not decisions.offloads)
    if decisions.compile:
        # Blocks have one fixed length but the number of documents (cu_seqlens' length) varies: default
        # dynamic-shape handling recompiles once, then treats that dimension as dynamic.
        for layer in decoder_layers(model):
            layer.compile()
    return shard(model, decisions) if decisions.fsdp else model


def set_head_groups(layers: Sequence[nn.Module], groups: int) -> None:
    """KV-head groups each layer's varlen attention runs its backward in (read by
    runner.train.attention.varlen_attention_forward from the attention module; 1 = the kernel's own backward)."""
    for layer in layers:
        for module in layer.modules():
            module.head_groups = max(1, int(groups))


def install_recompute(model: nn.Module, plans: Sequence[LayerPlan], inside_compile: bool = False) -> int:
    """Each text decoder layer's recompute plan: no checkpoint; a checkpoint region inside the layer's own forward
    for its compilation (`inside_compile`); or transformers' checkpoint call, made by the function its input's place
    needs (host memory: runner.train.offload; regenerated: runner.train.regenerate) and keeping attention outputs
    where the plan says. Returns how many layers recompute."""
    from runner.train.model import checkpoint_in_compile, keep_attention_context, text_decoder_layers

    recomputed = sum(1 for p in plans if p.recompute)
    if not recomputed:
        return 0
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # transformers ≥ 5.2x; the older name is a deprecated alias there
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    from runner.train.regenerate import InputChain

    chain = InputChain()
    for layer, plan in zip(text_decoder_layers(model), plans, strict=True):
        if not plan.recompute:
            layer.gradient_checkpointing = False  # transformers' GradientCheckpointingLayer reads it on every call
        elif inside_compile:
            checkpoint_in_compile(layer, recompute_attention=not plan.keep_attention)
        else:
            func = _checkpoint_function(layer, plan, chain, keep_attention_context)
            if func is not None:
                layer._gradient_checkpointing_func = func
    return recomputed


def _checkpoint_function(layer: nn.Module, plan: LayerPlan, chain: Any, keep_context: Any) -> Any:
    """What GradientCheckpointingLayer calls in place of torch.utils.checkpoint.checkpoint for this layer's plan
    (None: the plain checkpoint)."""
    from runner.train.offload import offloaded_checkpoint
    from runner.train.regenerate import regenerated_checkpoint, source_checkpoint

    if plan.keep_attention:
        return functools.partial(checkpoint, use_reentrant=False, context_fn=keep_context)
    if plan.input == HOSTED:
        return functools.partial(offloaded_checkpoint, use_reentrant=False)
    if plan.input == SOURCE:
        return functools.partial(source_checkpoint, chain, layer, True, use_reentrant=False)
    if plan.input == REGENERATED:
        return functools.partial(regenerated_checkpoint, chain, use_reentrant=False)
    return None


def layer_plans(layers: int, recompute: int | None, keep_attention: bool = False,
                places: Sequence[str] = ()) -> list[LayerPlan]:
    """Per-layer plans for `layers` layers, the first `recompute` (None = all) recomputed, their inputs at `places`
    (gpu where not given): what runner.decide plans, for code that builds a model without a run's decisions."""
    k = layers if recompute is None else min(recompute, layers)
    where = list(places) + ["gpu"] * (k - len(places))
    return [LayerPlan(True, keep_attention, where[i]) for i in range(k)] + \
        [LayerPlan(False, False, KEPT) for _ in range(layers - k)]


def shard(model: nn.Module, decisions: Decisions) -> nn.Module:
    """FSDP2 over all ranks: fully_shard each decoder layer, then the root; bf16 compute with fp32 reduction on GPU."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from runner.train.model import decoder_layers

    device, world = decisions.device, torch.distributed.get_world_size()
    mesh = init_device_mesh(device, (world,))
    # bf16 compute with fp32 gradient reduction, as the 27B recipe; on CPU everything stays fp32 (exact replays).
    # One rank has nothing to sum: there an fp32 reduction only copies each gradient to fp32 and back (the same
    # values either way), so it reduces in the compute dtype.
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32 if world > 1 else None) \
        if device == "cuda" else MixedPrecisionPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model
