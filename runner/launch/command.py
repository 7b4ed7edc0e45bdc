"""Launch: the torchrun command (a pure function), the run directory, and a process-group-safe subprocess."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.events.paths import RunPaths
from runner.writes import redact
from runner.writes import atomic_write_json
from runner.spec import RunSpec

# Variables a rank needs for reproducible numerics; set for every run, recorded in the record.
RUN_ENV = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
    "OMP_NUM_THREADS": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}


ALLOCATOR_DEFAULTS = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
"""Set for every run unless the user's environment sets them (then theirs is kept; either way it is recorded).
CUDA's caching allocator otherwise keeps freed blocks at their sizes, and long blocks' large, varying tensors
strand memory between them: a long-block run on an H100 ran out of memory in step 2 with gigabytes reserved but
unallocated, and with segments that grow in place it trained (benchmarks/long-blocks-h200/README.md)."""


# One folder name: no separators, no "..", nothing a shell or a filesystem treats specially.
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_id(run_id: str) -> None:
    """A run id names a folder under the runs folder and a file in the records folder, never a path elsewhere."""
    if not RUN_ID_RE.fullmatch(run_id) or ".." in run_id:
        raise UserError(f"--run-id {run_id!r}: a run id is one folder name of letters, digits, '.', '_' and '-' "
                        "(no '/', '..' or absolute path), starting with a letter or digit; e.g. --run-id my-run-1")


def check_writable(folder: Path, option: str) -> None:
    """The folder (or the nearest part of it that exists, where it will be made) is a folder this user can write."""
    probe = folder
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UserError(f"{option} {folder}: {probe} is a file, not a folder; pass a folder you can write, "
                        f"e.g. {option} ~/sft-runs")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"{option} {folder}: cannot write in {probe} (permission denied or read-only); pass a "
                        f"folder you can write, e.g. {option} ~/sft-runs")


def check_run_target(runs_dir: Path, records_dir: Path, run_id: str | None = None) -> None:
    """Bad input found before anything is written: folders this user cannot write, a run id that is a path."""
    check_writable(runs_dir, "--runs-dir")
    check_writable(records_dir, "--records-dir")
    if run_id is not None:
        check_run_id(run_id)


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


def prepare_run(paths: RunPaths, spec: RunSpec, decisions: Any = None) -> tuple[RunSpec, Any]:
    """The run folder's spec (levers resolved) and decisions (runner.decide), each written once before launch: a
    folder that holds them already (the supervisor after `spawn`, a resumed run, another node on a shared
    filesystem) keeps them (a resumed spec that goes on past its train.max_steps is written again). `decisions`: given whole (a replay's recorded ones), else decided here, probing this
    node's attention kernels."""
    from runner.decide import Decisions, decide_run
    from runner.plan.autotune import resolve_levers

    spec = resolve_levers(spec)  # what the estimate planned; a recorded spec (replay, resume) has nothing left to pick
    if not paths.spec.is_file() or json.loads(paths.spec.read_text()) != redact(spec.to_dict()):
        write_spec(paths, spec)  # a resume may carry on past the recorded train.max_steps
    if paths.decisions.is_file():
        return spec, Decisions.read(paths.decisions)
    decisions = decisions if decisions is not None else decide_run(spec, probe=True)
    decisions.write(paths.decisions)
    return spec, decisions


def run_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**ALLOCATOR_DEFAULTS, **os.environ}
    env.update(RUN_ENV)
    # The ranks import this checkout's `runner` even when it is not installed.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env
