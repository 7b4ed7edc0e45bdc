"""Disk a run needs (its checkpoints, its export, its events and record) against the free space where they go."""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from runner.engines import saved_as
from runner.errors import PredictedNotToFit, UserError
from runner.plan.constants import ADAM_STATES_PER_PARAM, DTYPE_BYTES
from runner.spec import RunSpec

NF4_BYTES = 0.5625
"""A 4-bit base weight with its block scale (QLoRA's base as bitsandbytes stores it)."""
EVENT_LINE_BYTES = 600
"""One rank's event line for one step, with room for the node sampler's and the logs' lines beside it."""
DCP_ENTRY_BYTES = 2048
"""What torch.distributed.checkpoint writes beside each tensor shard (its header and the metadata's entry): the
tiny embedded model's 3.4 MB checkpoint holds about 0.7 MB of it."""
RANK_STATE_BYTES = 16 << 10
"""A rank's data position and RNG states (rank<r>.pt)."""
RESERVE_BYTES = 1 << 20
"""Held by the supervisor from the start in the run and records folders, freed to finish the record when the disk
fills (runner.launch.supervisor): counted as needed here."""


@dataclass(frozen=True)
class DiskPlan:
    """What a run writes, in bytes, and the free space of the folder it goes to."""

    folder: str
    free_bytes: int | None
    needed_bytes: int
    checkpoint_bytes: int
    checkpoints: int
    export_bytes: int
    export: str

    @property
    def fits(self) -> bool:
        return self.free_bytes is None or self.needed_bytes <= self.free_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits}

    def describe(self) -> str:
        free = "unknown" if self.free_bytes is None else human(self.free_bytes)
        ckpt = (f"{self.checkpoints} checkpoint(s) × {human(self.checkpoint_bytes)}"
                if self.checkpoints else "no checkpoints")
        return (f"disk: {human(self.needed_bytes)} needed ({ckpt}, export {self.export} {human(self.export_bytes)}) "
                f"of {free} free in {self.folder}")


def human(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def export_kind(spec: RunSpec) -> str:
    """What output.save writes, `auto` decided (runner.engines.saved_as: the one rule)."""
    return saved_as(spec)


def _base_bytes(spec: RunSpec, weight_b: float) -> float:
    return NF4_BYTES if spec.method.kind == "qlora" else weight_b


def _adapter_params(spec: RunSpec, arch: Any) -> int:
    from runner.plan.lora import lora_params

    return lora_params(arch, spec.method.lora)[0]


def export_bytes(spec: RunSpec, arch: Any, weight_b: float = 2, master_b: float = 4) -> int:
    """Bytes output.save writes at the end, for every value by name: none; adapter (the adapter weights in the
    trainable dtype); full (every weight as trained: the master dtype for a full fine-tune, the base as loaded plus
    the adapter otherwise); merged (the whole model, as loaded); auto as runner.gate.disk.export_kind says."""
    kind = export_kind(spec)
    lora = spec.method.kind in ("lora", "qlora")
    if kind == "none":
        return 0
    if kind == "adapter":
        return int(_adapter_params(spec, arch) * master_b)
    if kind == "merged":
        return int(arch.params_total * weight_b)
    if kind == "full":
        if lora:
            return int(arch.params_total * weight_b + _adapter_params(spec, arch) * master_b)
        return int(arch.params_total * master_b)
    raise ValueError(f"output.save {spec.output.save!r} has no export size")


def checkpoint_bytes(spec: RunSpec, arch: Any, world: int, weight_b: float = 2, master_b: float = 4) -> int:
    """One checkpoint, every rank's shards together: the weights and AdamW's states (the native engine's DCP state
    dict holds a LoRA run's frozen base too; the Hugging Face trainer's only the adapter), each tensor's headers
    (every rank writes a shard of each) and the ranks' own state files."""
    from runner.engines import engine_for

    states = 1 + ADAM_STATES_PER_PARAM
    # Per layer about a dozen tensors (projections, norms), each with a weight, two AdamW states and a step.
    entries = world * (arch.layers * 12 + 4) * (states + 1)
    overhead = entries * DCP_ENTRY_BYTES + world * RANK_STATE_BYTES
    if spec.method.kind in ("lora", "qlora"):
        adapter = _adapter_params(spec, arch) * master_b * states
        base = 0 if engine_for(spec.engine).hf_trainer else arch.params_total * _base_bytes(spec, weight_b)
        return int(adapter + base + overhead)
    return int(arch.params_total * master_b + arch.text_params * master_b * ADAM_STATES_PER_PARAM + overhead)


def checkpoint_count(spec: RunSpec, steps: int | None) -> int:
    """Checkpoints train.checkpoint_every writes over `steps` (every one is kept: the last one is always written)."""
    every = spec.train.checkpoint_every
    if not every:
        return 0
    return max(1, math.ceil((steps or spec.train.max_steps or every) / every))


def free_bytes(folder: Path) -> tuple[Path, int | None]:
    """The nearest existing folder at or above `folder`, and the bytes an unprivileged writer has free there."""
    p = Path(os.path.abspath(folder))
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return p, shutil.disk_usage(p).free
    except OSError:
        return p, None


def disk_plan(spec: RunSpec, runs_dir: Path, steps: int | None = None) -> DiskPlan:
    """The run's bytes (checkpoints, export, events, the supervisor's reserve) against the free space of runs_dir."""
    from runner.plan.choices import make_plan

    plan = make_plan(spec)
    weight_b = DTYPE_BYTES.get(plan.dtype, 2)
    master_b = DTYPE_BYTES.get(plan.precision.master, 4)
    steps = steps or spec.train.max_steps
    n = checkpoint_count(spec, steps)
    ckpt = checkpoint_bytes(spec, plan.arch, plan.world, weight_b, master_b)
    export = export_bytes(spec, plan.arch, weight_b, master_b)
    events = (steps or 0) * plan.world * EVENT_LINE_BYTES
    folder, free = free_bytes(runs_dir)
    return DiskPlan(str(folder), free, n * ckpt + export + events + RESERVE_BYTES, ckpt, n, export,
                    export_kind(spec))


def check_disk(spec: RunSpec, runs_dir: Path, steps: int | None, force: bool,
               from_step: int = 0) -> DiskPlan | None:
    """Refuse (PredictedNotToFit, exit 2) a run whose checkpoints and export cannot fit in the free space of runs_dir;
    `from_step`: a resume writes only what comes after it. None where the model's size cannot be read."""
    if force:
        return None
    try:
        disk = disk_plan(spec, runs_dir, steps)
    except UserError:
        return None
    if from_step and disk.checkpoints:  # those written before from_step are on the disk already
        written = min(from_step // spec.train.checkpoint_every, disk.checkpoints)
        disk = replace(disk, checkpoints=disk.checkpoints - written,
                       needed_bytes=disk.needed_bytes - written * disk.checkpoint_bytes)
    if not disk.fits:
        raise PredictedNotToFit(f"not enough disk in {disk.folder}: {human(disk.needed_bytes)} needed "
                        f"({disk.needed_bytes} bytes: {disk.checkpoints} checkpoint(s) of "
                        f"{human(disk.checkpoint_bytes)}, export {disk.export} {human(disk.export_bytes)}), "
                        f"{human(disk.free_bytes or 0)} ({disk.free_bytes} bytes) free; free space there, choose "
                        "another --runs-dir or raise train.checkpoint_every")
    return disk
