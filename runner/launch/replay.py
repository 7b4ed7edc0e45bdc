"""Replay's preparation, the same for `runner replay` and the TUI: the record's lock verified, its spec rebuilt and
resolved for this machine, and the pins that differ from the record's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.launch.run import REPO_DIR
from runner.record import records
from runner.record.replay import current_pins, drift, recorded_decisions, spec_from_record
from runner.spec import RunSpec, resolve


@dataclass(frozen=True)
class PreparedReplay:
    original: dict[str, Any]  # the record replayed
    spec: RunSpec  # its spec, resolved for this machine
    drift: list[dict[str, Any]]  # the pins that differ: pin, recorded, current, strict
    decisions: Any = None  # the record's whole decisions, given to the replay's ranks (None: decided again)


def prepare_replay(path: Path, gpu_count: int | None = None, trust_remote_code: bool = False) -> PreparedReplay:
    """Refuse a record whose lock does not verify or whose GPUs this machine lacks; `gpu_count` is the GPUs visible
    here (None: ask torch)."""
    ok, reason = records.verify(path)
    if not ok:
        raise UserError(f"refusing to replay: {reason}")
    original = records.load(path)
    spec = spec_from_record(original, trust_remote_code)
    if gpu_count is None:
        import torch

        gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec.hardware.device == "cuda" and gpu_count == 0:
        raise UserError(f"{original['id']} ran on GPUs and this machine has none visible: replay it on a GPU "
                        f"machine (`runner replay {path}` there)")
    spec = resolve(spec, cuda_available=gpu_count > 0, gpu_count=gpu_count)
    return PreparedReplay(original, spec, drift(original["pins"], current_pins(spec, REPO_DIR)),
                          recorded_decisions(original))
