"""Export at the end of training: the full model as HF safetensors, or the LoRA adapter in peft's format.

Every rank takes part in gathering the weights (an all-gather per tensor); rank 0 writes the files, with the
tokenizer, and returns their names and sha256 for the `end` event and the run record.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn
from runner.events.paths import RunPaths



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


def export(kind: str, model: nn.Module, tokenizer: Any, run_dir: Path, rank: int) -> dict[str, Any] | None:
    """Collective: kind is output.save ('full' | 'adapter'); rank 0 returns {dir, files: {name: sha256}}."""
    if kind == "none":
        return None
    if kind not in ("adapter", "full"):
        raise ValueError(f"output.save must be none, adapter or full, got {kind!r}")
    out_dir = RunPaths(run_dir).export
    # For an adapter, peft keeps only the adapter tensors of the state dict it is given, under its own key names.
    state = _gather(model, trainable_only=kind == "adapter")
    if rank != 0:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    return {"dir": str(out_dir), "kind": kind, "files": file_hashes(out_dir)}
