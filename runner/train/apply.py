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
from runner.train.model import decoder_layers, text_decoder_layers


def apply(model: nn.Module, decisions: Decisions) -> nn.Module:
    """The model as the decisions run it (returned: FSDP2 wraps it in place). Tiles go on before checkpointing and
    FSDP2 wrap the layers; each layer's checkpoint region is set before its compilation sees it."""
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


def _attention_ops() -> set[Any]:
    ops = set()
    for ns, name in (("sft_tui", "fa4_varlen_fwd"), ("torch_attn", "_varlen_attn")):
        packet = getattr(getattr(torch.ops, ns, None), name, None)
        if packet is not None:
            ops.add(packet.default)
    return ops


def keep_attention_context() -> Any:
    """Selective recompute: the attention kernel's outputs are kept from forward; everything else recomputes."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    keep = _attention_ops()

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def checkpoint_in_compile(layer: nn.Module, recompute_attention: bool = True) -> None:
    """Make the layer's own forward a checkpoint region, so a later `layer.compile()` sees it.

    `recompute_attention=False` keeps the attention kernel's output from forward (`keep_attention_context`).

    Recomputing around a compiled layer (what transformers 5.17's GradientCheckpointingLayer does: checkpoint calls
    the compiled `__call__`) reruns the whole compiled forward in backward, down_proj and the residual adds included,
    although backward reads none of their outputs. With the checkpoint inside the compiled region, the partitioner
    keeps only the layer's inputs and recomputes, within the compiled backward, just the operations whose results
    backward reads: a dense decoder layer no longer recomputes its last projection (a third of the MLP's matmul
    work; benchmarks/README.md has the step time it saved). Later transformers releases checkpoint `forward`,
    which comes to the same; this makes it so on every version.
    """
    forward = layer.forward
    extra: dict[str, Any] = {} if recompute_attention else {"context_fn": keep_attention_context}
    # transformers ≥ 5.25 with the `kernels` package wraps attention forwards in a context variable that is set and
    # reset around each call: a Python side effect, which dynamo refuses inside a checkpoint region, so it left
    # every such layer uncompiled without a word (0 compiled matmuls). Skipping that set-and-reset when backward
    # recomputes the region changes nothing (it is undone before the forward returns).
    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True

    def recomputed_forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)

    layer.gradient_checkpointing = False  # transformers' wrapper (outside the compiled region) stays out
    layer.forward = recomputed_forward


def enable_recompute(model: nn.Module, recompute_layers: int | None, offload: bool = False,
                     inside_compile: bool = False, recompute_attention: bool = True,
                     offload_layers: int | None = None, regenerate: bool = False) -> int:
    """Non-reentrant activation checkpointing of the first `recompute_layers` decoder layers (None = all), for code
    that builds a model without a run's decisions (tests, benchmarks): the per-layer plan runner.decide would make
    (`offload`: the first `offload_layers` recomputed layers' inputs in host memory; `regenerate`: as many of the
    others regenerated from the layer before's), put on by runner.train.apply.install_recompute. Returns how many
    layers recompute."""
    from runner.facts.gpus import layer_input_places, regenerated_layers

    n = len(text_decoder_layers(model))
    k = n if recompute_layers is None else min(recompute_layers, n)
    places: list[str] = []
    if offload or regenerate:
        hosted = k if offload_layers is None else min(offload_layers, k)
        places = layer_input_places(k, hosted, regenerated_layers(k, hosted, regenerate))
        if not offload:  # regenerated from a source kept on the GPU
            places = ["gpu" if p == "host" else p for p in places]
    plans = layer_plans(n, k, keep_attention=not recompute_attention and not offload, places=places)
    return install_recompute(model, plans, inside_compile)


def shard(model: nn.Module, decisions: Decisions) -> nn.Module:
    """FSDP2 over all ranks: fully_shard each decoder layer, then the root; bf16 compute with fp32 reduction on GPU."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

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
