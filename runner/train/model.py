"""Load the model (pinned revision, or random init from its config) and shard it with FSDP2: each decoder layer,
then the root."""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from runner.imports import from_transformers
from runner.spec import model_source
# Where callers look for them:
from runner.train.loader import WEIGHT_FILES, has_weights, is_vlm_config, model_class  # noqa: F401

if TYPE_CHECKING:
    from runner.spec import RunSpec

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def load_tokenizer(spec: RunSpec) -> Any:
    AutoTokenizer = from_transformers("AutoTokenizer")

    src, rev = model_source(spec)
    tok = AutoTokenizer.from_pretrained(src, revision=rev, trust_remote_code=spec.model.trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return quiet_length_warning(tok)


def quiet_length_warning(tok: Any) -> Any:
    """Silence the tokenizer's "longer than the specified maximum sequence length ... will result in indexing
    errors" warning: documents longer than model_max_length are tokenised on purpose here, and packing cuts them
    into seq_len blocks, so no sequence that long ever reaches the model. (transformers warns once per tokenizer;
    marking it as already given is its own way to skip it.)"""
    warned = getattr(tok, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tok


def load_config(spec: RunSpec) -> Any:
    AutoConfig = from_transformers("AutoConfig")

    src, rev = model_source(spec)
    return AutoConfig.from_pretrained(src, revision=rev, trust_remote_code=spec.model.trust_remote_code)


def load_model(spec: RunSpec, attn_impl: str, seed: int = 0, device: str = "cpu", varlen_kernel: str = "") -> nn.Module:
    """The HF model in spec.model.dtype: the checkpoint's weights on CPU, or random ones drawn with `seed`.

    Every rank loads the whole model and FSDP keeps its shard (the notebook's way: simple, and fine up to the
    host memory of one node); random init draws the same weights on every rank from the same seed, on `device`
    when that is cuda: drawing billions of weights on the host takes minutes.
    """
    from runner.train.attention import VARLEN, register_varlen

    if attn_impl == VARLEN:
        register_varlen(varlen_kernel or None)
    src, rev = model_source(spec)
    dtype = DTYPES.get(spec.model.dtype, torch.float32)
    config = load_config(spec)
    cls = model_class(spec, config)
    if spec.model.init == "random":
        torch.manual_seed(seed)
        with torch.device("cuda") if device == "cuda" else contextlib.nullcontext():
            model = cls.from_config(config, dtype=dtype, attn_implementation=attn_impl,
                                    trust_remote_code=spec.model.trust_remote_code)
    else:
        model = cls.from_pretrained(src, revision=rev, dtype=dtype, attn_implementation=attn_impl,
                                    trust_remote_code=spec.model.trust_remote_code)
    disable_cache(model)
    expose_backbone(model)
    return model


def expose_backbone(model: nn.Module) -> None:
    """Make `model.base_model` the decoder stack where the class's `base_model_prefix` names no attribute
    (Llama4ForCausalLM: prefix "language_model", stack under `model`). Without it `base_model` is the causal LM
    itself, and a loss that runs the stack and lm_head apart (the native chunked and fused losses, TRL's fused lm
    head) gets logits where it expects hidden states."""
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and getattr(model, prefix, None) is None and isinstance(getattr(model, "model", None), nn.Module):
        model.base_model_prefix = "model"


def disable_cache(model: nn.Module) -> None:
    # The KV cache only helps generation; in training it wastes memory and conflicts with checkpointing.
    model.config.use_cache = False
    text_config = getattr(model.config, "text_config", None)
    if text_config is not None:
        text_config.use_cache = False


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP shards one by one, found from the model's own _no_split_modules.

    For a VLM-style checkpoint these are the language tower's layers (`model.model.language_model.layers`)
    and the vision tower's blocks.
    """
    names: set[str] = set()
    for m in model.modules():
        names |= set(getattr(m, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise RuntimeError(f"{type(model).__name__} declares no _no_split_modules; cannot find its decoder layers")
    return layers


def text_decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The language model's decoder layers in order (a VLM-style checkpoint's language tower)."""
    from runner.train.loss import causal_lm_parts

    base, _ = causal_lm_parts(model)
    return list(getattr(base, "language_model", base).layers)


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
    """Non-reentrant activation checkpointing of the first `recompute_layers` decoder layers (None = all).

    The layers left out keep their activations from forward to backward. With `offload` the inputs of the first
    `offload_layers` recomputed layers (None = all) wait in host memory (runner.train.offload), the others' on the
    GPU, or with `regenerate` (eager layers) as many of them as there are hosted ones are computed again in backward
    from the layer before's (runner.train.regenerate). With `inside_compile` each recomputed layer's forward becomes
    a checkpoint region for the layer's compilation (`checkpoint_in_compile`; the caller compiles the layers).
    Returns how many layers recompute.
    """
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # transformers ≥ 5.2x; the older name is a deprecated alias there
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = text_decoder_layers(model)
    keep = len(layers) if recompute_layers is None else min(recompute_layers, len(layers))
    for layer in layers[keep:]:
        # transformers' GradientCheckpointingLayer consults this flag on every call.
        layer.gradient_checkpointing = False
    if inside_compile:
        for layer in layers[:keep]:
            checkpoint_in_compile(layer, recompute_attention)
    elif not recompute_attention and not offload:
        for layer in layers[:keep]:
            layer._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=False,
                                                                   context_fn=keep_attention_context)
    elif offload or regenerate:
        _place_layer_inputs(layers[:keep], offload, keep if offload_layers is None else min(offload_layers, keep),
                            regenerate)
    return keep


def _place_layer_inputs(layers: list[nn.Module], offload: bool, hosted: int, regenerate: bool) -> None:
    """Each recomputed layer's checkpoint as runner.facts.gpus.layer_input_places puts its input: in host memory
    (`offload`; runner.train.offload), regenerated from the layer before's (`regenerate`; runner.train.regenerate),
    or on the GPU. GradientCheckpointingLayer calls `_gradient_checkpointing_func` in place of
    torch.utils.checkpoint.checkpoint."""
    from runner.facts.gpus import HOSTED, REGENERATED, SOURCE, layer_input_places, regenerated_layers
    from runner.train.offload import offloaded_checkpoint
    from runner.train.regenerate import InputChain, regenerated_checkpoint, source_checkpoint

    chain = InputChain()
    places = layer_input_places(len(layers), hosted, regenerated_layers(len(layers), hosted, regenerate))
    for layer, place in zip(layers, places, strict=True):
        if place == HOSTED and offload:
            func = functools.partial(offloaded_checkpoint, use_reentrant=False)
        elif place == SOURCE:
            func = functools.partial(source_checkpoint, chain, layer, offload, use_reentrant=False)
        elif place == REGENERATED:
            func = functools.partial(regenerated_checkpoint, chain, use_reentrant=False)
        else:
            continue
        layer._gradient_checkpointing_func = func


def weights_bf16(model: nn.Module) -> bool:
    """Whether every weight is already in the bf16 compute dtype (runner.facts.decisions.fsdp_wrapped asks)."""
    return all(p.dtype == torch.bfloat16 for p in model.parameters())


def shard_model(model: nn.Module, device: str, activation_checkpointing: bool,
                compile_layers: bool = False, recompute_layers: int | None = None,
                offload_activations: bool = False, fsdp_one_rank: bool = False,
                recompute_attention: bool = True, mlp_tile: int | None = None,
                offload_layers: int | None = None) -> nn.Module:
    """FSDP2 over all ranks: fully_shard each decoder layer, then the root; bf16 compute with fp32 reduction on GPU.

    One rank trains the plain module unless runner.facts.decisions.fsdp_wrapped says otherwise: FSDP2 there copies each
    layer's weights in and its gradients out, and its hooks cost host time that short steps cannot hide.
    With `mlp_tile` each decoder layer's MLP runs in tiles of that many tokens and its RMSNorms are recomputed in
    backward (runner.train.tiling). `offload_layers` as enable_recompute's.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    compile_layers = compile_layers and device == "cuda"
    offload = offload_activations and device == "cuda"
    if mlp_tile:
        from runner.train.tiling import recompute_outer_norms, tile_layers

        layers = text_decoder_layers(model)
        tile_layers(layers, mlp_tile)  # before FSDP2 and checkpointing wrap the layers
        recompute_outer_norms(model, layers, mlp_tile)
    if activation_checkpointing:
        # Offload works through saved-tensor hooks around an eager checkpoint, so it keeps transformers' wrapper.
        enable_recompute(model, recompute_layers, offload=offload, inside_compile=compile_layers and not offload,
                         recompute_attention=recompute_attention, offload_layers=offload_layers,
                         regenerate=offload and not compile_layers)
    world = torch.distributed.get_world_size()
    layers = decoder_layers(model)
    if compile_layers:
        # Blocks have one fixed length but the number of documents (cu_seqlens' length) varies: default
        # dynamic-shape handling recompiles once, then treats that dimension as dynamic.
        for layer in layers:
            layer.compile()
    from runner.facts.decisions import fsdp_wrapped

    if not fsdp_wrapped("native", world, device, fsdp_one_rank, weights_bf16(model)):
        return model
    mesh = init_device_mesh(device, (world,))
    # bf16 compute with fp32 gradient reduction, as the 27B recipe; on CPU everything stays fp32 (exact replays).
    # One rank has nothing to sum: there an fp32 reduction only copies each gradient to fp32 and back (the same
    # values either way), so it reduces in the compute dtype.
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32 if world > 1 else None) \
        if device == "cuda" else MixedPrecisionPolicy()
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
