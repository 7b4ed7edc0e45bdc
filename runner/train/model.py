"""Load the model at its pinned revision and shard it with FSDP2: each decoder layer, then the root."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from runner.spec import RunSpec, resolve_embedded

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def model_source(spec: RunSpec) -> tuple[str, str | None]:
    """(what from_pretrained loads, revision): a local path wins over the hub id."""
    if spec.model.path:
        return str(resolve_embedded(spec.model.path)), None
    return spec.model.id, spec.model.revision


def load_tokenizer(spec: RunSpec) -> Any:
    from transformers import AutoTokenizer

    src, rev = model_source(spec)
    tok = AutoTokenizer.from_pretrained(src, revision=rev, trust_remote_code=spec.model.trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def choose_attention(spec: RunSpec, device: str) -> str:
    """The HF attention implementation that keeps packed documents apart on this device.

    sdpa and eager get a block-diagonal mask that transformers builds from the reset position_ids (the
    explicit-mask fallback); flash/varlen kernels get cu_seqlens directly.
    """
    choice = spec.model.attn_implementation
    if choice != "auto":
        return choice
    return "sdpa"


def load_model(spec: RunSpec, device: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    src, rev = model_source(spec)
    dtype = DTYPES[spec.model.dtype]
    kwargs: dict[str, Any] = dict(revision=rev, dtype=dtype, trust_remote_code=spec.model.trust_remote_code,
                                  attn_implementation=choose_attention(spec, device))
    loader = spec.model.loader
    if loader == "image_text_to_text":
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(src, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(src, **kwargs)
    model.config.use_cache = False
    text_config = getattr(model.config, "text_config", None)
    if text_config is not None:
        text_config.use_cache = False
    return model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP shards one by one, found from the model's own _no_split_modules."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise RuntimeError(f"{type(model).__name__} declares no _no_split_modules; cannot find its decoder layers")
    return layers


def shard_model(model: nn.Module, device: str, activation_checkpointing: bool) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    world = torch.distributed.get_world_size()
    mesh = init_device_mesh(device, (world,))
    # bf16 compute with fp32 gradient reduction, as the 27B recipe; on CPU everything stays fp32 (exact replays).
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if device == "cuda" else \
        MixedPrecisionPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model
