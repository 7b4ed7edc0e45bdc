"""Resumable checkpoints with torch.distributed.checkpoint: model, optimizer, step, data position, RNG states.

Layout: runs/<id>/checkpoints/step<N>/ holds the DCP shards of {"model", "optim"} (every rank writes its own),
`rank<r>.pt` (that rank's data position and RNG states) and `meta.json` (written last, by rank 0). A checkpoint
is built in a hidden `.step<N>.tmp` folder and renamed when every rank has finished, so a half-written one is
never picked up by `RunPaths.latest_checkpoint`.

The TRL engine's checkpoints are the Hugging Face trainer's, in the same folder: `checkpoint-<N>/`, written in
place, with `trainer_state.json` written after the model, optimizer, scheduler and RNG states. Both layouts count
as complete only with their last file, so a resume (or a record's resume hint) never picks a half-written one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from runner.events.paths import CHECKPOINT_META, RunPaths


def rng_state(device: str) -> dict[str, Any]:
    import numpy as np

    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if device == "cuda":
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any], device: str) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def _barrier(group: dist.ProcessGroup | None) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)


def save(run_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int,
         world_size: int, device: str, rank_state: dict[str, Any], group: dist.ProcessGroup | None = None) -> Path:
    """Write step<N> collectively (every rank calls this); returns the final folder."""
    from torch.distributed.checkpoint import save as dcp_save
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = RunPaths(run_dir).step_checkpoint(step)
    tmp = final.parent / f".{final.name}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(group)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    torch.save({**rank_state, "rng": rng_state(device)}, tmp / f"rank{rank}.pt")
    _barrier(group)
    if rank == 0:
        meta = {"step": step, "world_size": world_size, "saved": round(time.time(), 3)}
        with open(tmp / CHECKPOINT_META, "w") as f:
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    _barrier(group)
    return final


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int, world_size: int,
         device: str) -> dict[str, Any]:
    """Restore model, optimizer and RNG from a complete checkpoint; returns this rank's saved state."""
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    meta = json.loads((path / CHECKPOINT_META).read_text())
    if meta["world_size"] != world_size:
        # Model and optimizer would reshard, but each rank's data position belongs to its own shard.
        raise ValueError(f"checkpoint {path} was written by {meta['world_size']} ranks, this run has {world_size}: "
                         "resume with the same hardware.nproc_per_node and hardware.nodes")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp_load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    saved = torch.load(path / f"rank{rank}.pt", weights_only=False)
    set_rng_state(saved.pop("rng"), device)
    return {**saved, "step": meta["step"]}


def load_model_weights(path: Path, model: torch.nn.Module) -> None:
    """Load only the model part of a checkpoint into an unsharded model, in one process (export checks, tools)."""
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    sd = get_model_state_dict(model)
    state = {"model": sd}
    dcp_load(state, checkpoint_id=str(path), no_dist=True)
    set_model_state_dict(model, state["model"])
