"""Export at the end of training: the full model as HF safetensors, the LoRA adapter in peft's format, or the
LoRA merged into the base (a standalone model that loads without peft).

Every rank takes part in gathering the weights (an all-gather per tensor); rank 0 writes the files, with the
tokenizer, and returns their names and sha256 for the `end` event and the run record.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from runner.events.paths import RunPaths
from runner.imports import from_transformers

if TYPE_CHECKING:
    from runner.spec import RunSpec



def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(out_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(out_dir)): sha256_file(p) for p in sorted(out_dir.rglob("*")) if p.is_file()}


def _gather(model: nn.Module, trainable_only: bool) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
    return get_model_state_dict(model, options=opts)


def export(kind: str, model: nn.Module, tokenizer: Any, run_dir: Path, rank: int,
           spec: RunSpec | None = None) -> dict[str, Any] | None:
    """Collective: kind is output.save resolved ('full' | 'adapter' | 'merged', which needs the spec); rank 0
    returns {dir, kind, files: {name: sha256}}."""
    if kind == "none":
        return None
    if kind not in ("adapter", "full", "merged"):
        raise ValueError(f"output.save must be none, adapter, full or merged, got {kind!r}")
    out_dir = RunPaths(run_dir).export
    # For an adapter, peft keeps only the adapter tensors of the state dict it is given, under its own key names.
    state = _gather(model, trainable_only=kind == "adapter")
    quantized = kind == "merged" and spec is not None and spec.method.kind == "qlora"
    if quantized:
        # The base is stored in NF4: a merged model is the adapters folded into its dequantized bf16 weights.
        from runner.train.qlora import base_state_dict

        state = {**base_state_dict(model), **{k: v for k, v in state.items() if ".lora_" in k}}
    if rank != 0:
        return None
    if kind == "merged":
        assert spec is not None, "a merged export needs the spec (the base model's class and config)"
        write_merged(state, adapter_config(model), spec, tokenizer, out_dir)
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(out_dir), state_dict=state, safe_serialization=True)
        tokenizer.save_pretrained(str(out_dir))
    out = {"dir": str(out_dir), "kind": kind, "files": file_hashes(out_dir)}
    return {**out, "base": "nf4 dequantized to bf16"} if quantized else out


def adapter_config(peft_model: nn.Module) -> dict[str, Any]:
    """The adapter's config as peft writes it to adapter_config.json."""
    return peft_model.peft_config["default"].to_dict()


def write_merged(peft_state: dict[str, torch.Tensor], config: dict[str, Any], spec: RunSpec, tokenizer: Any,
                 out_dir: Path) -> None:
    """A live peft model's gathered state, merged (runner.train.merge) and written as a standalone model."""
    from runner.train.merge import merge_lora, split_peft_state

    base, adapter = split_peft_state(peft_state)
    write_model(merge_lora(base, adapter, config), spec, tokenizer, out_dir)


def write_model(state: dict[str, torch.Tensor], spec: RunSpec, tokenizer: Any, out_dir: Path) -> None:
    """A plain model's state dict written as a standalone HF model: config, safetensors shards, the tokenizer with
    its chat template, and generation_config.json (the base's own where it has one)."""
    from runner.spec import model_source
    from runner.train.model import load_config, model_class

    GenerationConfig = from_transformers("GenerationConfig")
    config = load_config(spec)
    with torch.device("meta"):
        model = model_class(spec, config).from_config(config, dtype=next(iter(state.values())).dtype,
                                                      trust_remote_code=spec.model.trust_remote_code)
    # Tied weights (lm_head = the embedding) are one tensor in the model; the state may name it twice.
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    still_meta = [n for n, p in model.named_parameters() if p.is_meta]
    if unexpected or still_meta:
        raise RuntimeError(f"export: the state does not fit {type(model).__name__}: "
                           f"unexpected {unexpected[:3]}, not filled {still_meta[:3]}")
    src, rev = model_source(spec)
    try:
        model.generation_config = GenerationConfig.from_pretrained(src, revision=rev)
    except OSError:  # the base has none: the one transformers derives from its config
        model.generation_config = GenerationConfig.from_model_config(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    model.generation_config.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
