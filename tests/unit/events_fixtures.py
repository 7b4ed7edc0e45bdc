"""Synthetic event records and run directories, as the trainer and the node sampler write them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

T0 = 1_700_000_000.0


def start(rank: int, world_size: int = 2, max_steps: int | None = 100, t: float = T0, node_rank: int = 0,
          local_rank: int | None = None, pid: int = 1000) -> dict[str, Any]:
    return {
        "event": "start", "t": t, "rank": rank, "local_rank": rank if local_rank is None else local_rank,
        "node_rank": node_rank, "world_size": world_size, "pid": pid + rank, "host": f"node{node_rank}",
        "max_steps": max_steps,
    }


def step(rank: int, step: int, loss: float = 2.0, t: float | None = None, tokens: int = 1000,
         step_s: float = 0.5, lr: float = 1e-3, mem_gib: float = 1.0, grad_norm: float = 1.0) -> dict[str, Any]:
    return {
        "t": T0 + step * step_s if t is None else t, "rank": rank, "step": step, "loss": loss, "lr": lr,
        "grad_norm": grad_norm, "tokens": tokens, "step_s": step_s, "mem_gib": mem_gib,
    }


def end(rank: int, step: int, reason: str = "done", t: float | None = None) -> dict[str, Any]:
    return {"event": "end", "t": T0 + step if t is None else t, "rank": rank, "step": step, "reason": reason}


def error(rank: int, step: int, t: float, cause: str = "CUDA out of memory", message: str = "boom") -> dict[str, Any]:
    return {"event": "error", "t": t, "rank": rank, "step": step, "cause": cause, "message": message}


def node_sample(node: int = 0, t: float = T0, util_pct: float | None = 87.0, ranks: list[int] | None = None
                ) -> dict[str, Any]:
    return {
        "t": t, "node": node, "host": f"node{node}",
        "gpus": [{
            "index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0", "util_pct": util_pct,
            "mem_used_gib": 40.5, "mem_total_gib": 79.6, "temp_c": 61, "power_w": None, "sm_clock_mhz": 1980,
            "ranks": [0] if ranks is None else ranks,
        }],
        "cpu_pct": 12.5, "ram_used_gib": 100.0, "ram_total_gib": 1000.0, "rank_rss_gib": {"0": 3.25},
    }


def line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record) + "\n").encode()


def write_events(run_dir: Path, source: str, records: list[dict[str, Any]]) -> Path:
    """Appends records to runs/<id>/events/<source>.jsonl."""
    path = run_dir / "events" / f"{source}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        for r in records:
            f.write(line(r))
    return path
