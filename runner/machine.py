"""What a run will see (`Machine`: its GPUs, detected here or declared for planning) and the `auto` values of
hardware.* that follow from it: the one rule the launcher, the estimator, the wizard and its sweep share; and the
folder where the runner keeps what it works out once per machine (`cache_dir`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CPU_RANKS = 2
"""Ranks of a CPU run with hardware.nproc_per_node=auto (gloo; the embedded demo's two)."""
GPUS_PER_NODE = 8
"""GPUs per node of a declared target whose count the spec leaves at auto: the usual node."""


@dataclass(frozen=True)
class Machine:
    """The GPUs per node a run will see (0: none) and their catalog type when known."""

    gpus: int = 0
    gpu: str | None = None
    declared: bool = False
    """A target the spec declares (planned from elsewhere), not this machine."""

    @classmethod
    def here(cls) -> Machine:
        """The GPUs torch sees here (CUDA_VISIBLE_DEVICES applies): what a launch gets."""
        import torch

        return cls(torch.cuda.device_count() if torch.cuda.is_available() else 0)


def target_machine(spec: Any, here: Machine, wanted: str | None = None) -> Machine:
    """The machine a spec's run will see: this one, unless the spec asks for GPUs this one lacks (a hardware.gpu
    type other than the one here, or GPUs when none is visible, with hardware.device=cuda or a named
    hardware.gpu); then the declared target: hardware.nproc_per_node GPUs (GPUS_PER_NODE when auto) of
    hardware.gpu. `wanted`: hardware.gpu's catalog name, where the caller has looked it up (it may be an alias)."""
    hw = spec.hardware
    if hw.device == "cpu":
        return here
    named = hw.gpu != "auto"
    other_type = named and here.gpu is not None and here.gpu != (wanted or hw.gpu)
    if here.gpus and not other_type:
        return here
    if not here.gpus and hw.device == "auto" and not named:
        return here  # auto on a machine without GPUs: a CPU run
    n = hw.nproc_per_node
    return Machine(GPUS_PER_NODE if n == "auto" else int(n), (wanted or hw.gpu) if named else None, declared=True)


def run_device(spec: Any, machine: Machine) -> str:
    """hardware.device resolved: auto is cuda where the machine has GPUs, else cpu."""
    device = spec.hardware.device
    return ("cuda" if machine.gpus else "cpu") if device == "auto" else device


def ranks_per_node(spec: Any, device: str, machine: Machine) -> int:
    """hardware.nproc_per_node resolved: as set, else one rank per GPU (GPUS_PER_NODE for a GPU plan on a
    machine whose GPUs are not known), CPU_RANKS on CPU."""
    n = spec.hardware.nproc_per_node
    if n != "auto":
        return int(n)
    if device != "cuda":
        return CPU_RANKS
    return machine.gpus or GPUS_PER_NODE


def hardware_problems(spec: Any, nproc: int | None = None) -> list[Any]:
    """hardware.* against each other and the block: ranks per node (`nproc`, or the spec's when it is not auto)
    and the sequence-parallel groups they are cut into."""
    from runner.errors import Problem

    hw, seq_len = spec.hardware, spec.train.seq_len
    n = hw.nproc_per_node if nproc is None else nproc
    if n != "auto" and int(n) < 1:
        return [Problem("hardware.nproc_per_node", f"must be at least 1, got {n}", "use 1 or more, or auto")]
    sp, out = hw.sequence_parallel, []
    if n != "auto" and int(n) % sp:
        # A group is consecutive ranks of one node: its all-to-alls run every layer and must not cross nodes.
        out.append(Problem("hardware.sequence_parallel", f"{sp} does not divide the {n} ranks per node",
                           f"use a divisor of {n} (e.g. {max(d for d in range(1, sp) if int(n) % d == 0)}), or "
                           f"hardware.nproc_per_node={sp * max(1, int(n) // sp)}"))
    if seq_len % sp:
        out.append(Problem("train.seq_len", f"must be a multiple of hardware.sequence_parallel={sp}, got {seq_len}",
                           f"try {seq_len + sp - seq_len % sp}"))
    return out


def cache_dir() -> Path:
    """Where the runner keeps what it works out once per machine and reuses across launches: the packing check's
    verdicts and flash-attn-4's compiled kernels. $SFT_TUI_CACHE_DIR, else sft-tui under $XDG_CACHE_HOME or
    ~/.cache."""
    base = os.environ.get("SFT_TUI_CACHE_DIR")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sft-tui"
