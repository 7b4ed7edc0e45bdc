"""Per-rank event lines: one JSON object per line in runs/<id>/events/rank<r>.jsonl (the contract in README)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any


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
