"""Load the model (pinned revision, or random init from its config) and shard it with FSDP2: each decoder layer,
then the root."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from runner.imports import from_transformers
# Where callers look for them:
from runner.decide.loader import WEIGHT_FILES, has_weights, is_vlm_config, load_config, model_class  # noqa: F401
from runner.decide.loader import model_source

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
    work; measured −5% step time on the 1.72B model at 32k). Later transformers releases checkpoint `forward`,
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
    from runner.train.apply import install_recompute, layer_plans

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


def weights_bf16(model: nn.Module) -> bool:
    """Whether every weight is already in the bf16 compute dtype (runner.decide.rules.fsdp_wrapped asks)."""
    return all(p.dtype == torch.bfloat16 for p in model.parameters())


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
