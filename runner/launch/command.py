"""Launch: the torchrun command (a pure function), the run directory, and a process-group-safe subprocess."""

from __future__ import annotations

import os
import secrets
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

from runner.events.paths import RunPaths
from runner.record.pins import redact
from runner.record.records import atomic_write_json
from runner.spec import RunSpec

# Variables a rank needs for reproducible numerics; set for every run, recorded in the record.
RUN_ENV = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
    "OMP_NUM_THREADS": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}


def new_run_id(name: str, runs_dir: Path, records_dir: Path) -> str:
    """A sortable id that never collides, also for two runs started in the same second (mkdir is the lock)."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:40] or "run"
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    for _ in range(100):
        run_id = f"{stamp}-{safe}-{secrets.token_hex(3)}"
        if (records_dir / f"{run_id}.json").exists():
            continue
        try:
            (runs_dir / run_id).mkdir()
            return run_id
        except FileExistsError:
            continue
    raise RuntimeError("could not allocate a run id")


def build_command(spec: RunSpec, spec_path: Path, run_id: str, node_rank: int = 0, resume: bool = False) -> list[str]:
    """The torchrun argv for one node. Single node: a standalone rendezvous on a free port; several: c10d.
    With resume, every rank continues from the run's latest complete checkpoint."""
    h = spec.hardware
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={h.nproc_per_node}",
            "--max-restarts=0"]
    if h.nodes == 1:
        argv.append("--standalone")
    else:
        argv += [f"--nnodes={h.nodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
                 f"--rdzv-endpoint={h.rdzv_endpoint}", f"--rdzv-id={run_id}"]
    argv += ["-m", "runner.train", "--spec", str(spec_path)]
    return argv + ["--resume"] if resume else argv


def command_line(argv: list[str]) -> str:
    return shlex.join(argv)


def write_spec(paths: RunPaths, spec: RunSpec) -> None:
    paths.events.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(parents=True, exist_ok=True)
    # Credentials never belong in a spec (use HF_TOKEN and friends); any that slipped in are not written down.
    # Atomic: on a shared filesystem every node of a multi-node run writes the same file.
    atomic_write_json(paths.spec, redact(spec.to_dict()))


def run_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RUN_ENV)
    # The ranks import this checkout's `runner` even when it is not installed.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env
