"""Load the model (pinned revision, or random init from its config) and shard it with FSDP2: each decoder layer,
then the root."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from runner.imports import from_transformers
from runner.spec import model_source
# Where callers look for them:
from runner.decide.loader import WEIGHT_FILES, has_weights, is_vlm_config, load_config, model_class  # noqa: F401

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


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
