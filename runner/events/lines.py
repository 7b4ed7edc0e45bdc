"""Per-rank event lines: one JSON object per line in runs/<id>/events/rank<r>.jsonl (the contract in README).

Two shapes: a step line (`StepEvent`: no "event" key, a "step"), and a lifecycle line with `"event": <kind>` (one of
EVENT_KINDS, each with its own writer method). Writers and readers use the names below; the JSON on disk is the
contract and does not change.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

START, TRAIN_BEGIN, RESUME, CHECKPOINT, END, ERROR = "start", "train_begin", "resume", "checkpoint", "end", "error"
EVENT_KINDS = (START, TRAIN_BEGIN, RESUME, CHECKPOINT, END, ERROR)
"""start: the rank is up (local_rank, node_rank, pid); train_begin: the engine's choices; resume: restarted from a
checkpoint; checkpoint: one saved; end: the rank finished (tokens, train_s, peak_mem_gib, data, ...); error: it
failed (cause, message)."""


@dataclass(frozen=True)
class StepEvent:
    """One logged optimizer step of one rank. `loss` is None when the block has no target token (never NaN);
    `extra` holds the keys engines add (data_s, doc_len_sq, global_loss, ...)."""

    t: float
    rank: int
    step: int
    loss: float | None
    lr: float
    grad_norm: float
    tokens: int
    step_s: float
    mem_gib: float
    extra: dict[str, Any] = field(default_factory=dict)

    KEYS = ("t", "rank", "step", "loss", "lr", "grad_norm", "tokens", "step_s", "mem_gib")

    @classmethod
    def from_line(cls, line: dict[str, Any]) -> StepEvent:
        return cls(*(line.get(k) for k in cls.KEYS), extra={k: v for k, v in line.items() if k not in cls.KEYS})


def is_step(line: dict[str, Any]) -> bool:
    """A step line: it has a step and is not a lifecycle event."""
    return "event" not in line and "step" in line


def step_lines(lines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in lines if is_step(e)]


def events_of(lines: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The lifecycle lines of one kind, in file order."""
    return [e for e in lines if e.get("event") == kind]


def first_event(lines: Iterable[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((e for e in lines if e.get("event") == kind), None)


class EventWriter:
    """Appends events for one rank; each line is flushed so tailers see it at once."""

    def __init__(self, path: Path, rank: int):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self._f = open(path, "a", buffering=1, encoding="utf-8")

    def write(self, **fields: Any) -> None:
        line = strict_line({"t": round(time.time(), 3), "rank": self.rank, **fields})
        self._f.write(json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n")
        self._f.flush()

    def step(self, step: int, loss: float, lr: float, grad_norm: float, tokens: int, step_s: float,
             mem_gib: float, **extra: Any) -> None:
        self.write(step=step, loss=loss, lr=lr, grad_norm=grad_norm, tokens=tokens, step_s=step_s, mem_gib=mem_gib,
                   **extra)

    def event(self, kind: str, **fields: Any) -> None:
        self.write(event=kind, **fields)

    def start(self, **fields: Any) -> None:
        self.event(START, **fields)

    def train_begin(self, **choices: Any) -> None:
        self.event(TRAIN_BEGIN, **choices)

    def resume(self, **fields: Any) -> None:
        self.event(RESUME, **fields)

    def checkpoint(self, **fields: Any) -> None:
        self.event(CHECKPOINT, **fields)

    def end(self, **summary: Any) -> None:
        self.event(END, **summary)

    def error(self, **fields: Any) -> None:
        self.event(ERROR, **fields)

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()


def strict_line(fields: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinity are not JSON: such a top-level number is written as null and named in `nonfinite`
    ({"loss": "nan"}), so strict parsers read every line and a diverged loss still reaches the display."""
    bad = {k: str(v) for k, v in fields.items() if isinstance(v, float) and not math.isfinite(v)}
    if not bad:
        return fields
    return {**{k: None if k in bad else v for k, v in fields.items()}, "nonfinite": bad}


def read_events(path: Path) -> list[dict[str, Any]]:
    """All complete JSON lines of one events file (a partial last line is ignored)."""
    out: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return out
    for line in text.split("\n")[:-1] if not text.endswith("\n") else text.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out
