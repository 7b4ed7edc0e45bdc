"""Launch: the torchrun command (a pure function), the run directory, and a process-group-safe subprocess."""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from runner.pins import redact
from runner.records import atomic_write_json
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


@dataclass
class RunPaths:
    run_dir: Path

    @property
    def spec(self) -> Path:
        return self.run_dir / "spec.json"

    @property
    def events(self) -> Path:
        return self.run_dir / "events"

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    @property
    def launcher_log(self) -> Path:
        return self.logs / "launcher.log"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"


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


class Launcher:
    """torchrun as a child in its own process group; cancel escalates SIGINT → SIGTERM → SIGKILL."""

    def __init__(self, argv: list[str], paths: RunPaths, env: dict[str, str] | None = None):
        self.argv = argv
        self.paths = paths
        self.env = env if env is not None else run_env()
        self.proc: subprocess.Popen[bytes] | None = None
        self.cancelled = False
        self._log = None

    def start(self) -> None:
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        self._log = open(self.paths.launcher_log, "ab")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.env, start_new_session=True)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        assert self.proc is not None
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout)
        self._close_log()
        return code

    def cancel(self, grace_s: float = 30.0) -> int:
        """Stop the whole run: torchrun forwards SIGTERM to ranks (they checkpoint and stop at a step boundary)."""
        self.cancelled = True
        return self.terminate(grace_s)

    def terminate(self, grace_s: float = 30.0) -> int:
        assert self.proc is not None
        # torchrun starts every rank in a session of its own, so collect the whole tree before signalling:
        # killing only torchrun's group would orphan the ranks.
        tree = self._tree()
        for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if self.proc.poll() is not None and not _alive(tree):
                break
            self._signal_group(sig)
            if sig == signal.SIGKILL:
                for pid in tree:
                    _kill_group(pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if self.proc.poll() is not None and not _alive(tree):
                    break
                time.sleep(0.1)
        code = self.proc.wait()
        self._close_log()
        return code

    def _signal_group(self, sig: int) -> None:
        assert self.proc is not None
        _kill_group(self.proc.pid, sig)

    def _tree(self) -> list[int]:
        import psutil

        try:
            return [p.pid for p in psutil.Process(self.pid).children(recursive=True)]
        except psutil.Error:
            return []

    def _close_log(self) -> None:
        if self._log is not None and not self._log.closed:
            self._log.close()


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pids: list[int]) -> bool:
    import psutil

    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False


def build_sbatch(spec: RunSpec, spec_path: Path, run_id: str, runs_dir: Path = Path("runs"),
                 records_dir: Path = Path("records"), port: int = 29500) -> str:
    """An sbatch script: one task per node, each runs `runner run --node-rank $SLURM_NODEID` (torchrun inside),
    with the c10d rendezvous on the first node of the allocation. Pure: same inputs, same text."""
    h = spec.hardware
    gpus = f"#SBATCH --gpus-per-node={h.nproc_per_node}\n" if h.device != "cpu" else ""
    node_cmd = (f"runner run {shlex.quote(str(spec_path))} --node-rank \"$SLURM_NODEID\" --run-id {run_id} "
                f"--runs-dir {shlex.quote(str(runs_dir))} --records-dir {shlex.quote(str(records_dir))} "
                f"--set hardware.rdzv_endpoint=\"$RDZV_HOST:{port}\" --plain")
    quoted = node_cmd.replace("'", "'\\''")
    return f"""#!/bin/bash
# Generated by `runner slurm` for run {run_id}: {h.nodes} node(s) x {h.nproc_per_node} rank(s).
# Every node must see the same {runs_dir}/ (a shared filesystem): events and logs of all nodes land in one run.
#SBATCH --job-name={spec.name}
#SBATCH --nodes={h.nodes}
#SBATCH --ntasks-per-node=1
{gpus}#SBATCH --exclusive
#SBATCH --output={runs_dir}/{run_id}/logs/slurm-%j.out
set -euo pipefail
export RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export NCCL_ASYNC_ERROR_HANDLING=1
srun --kill-on-bad-exit=1 bash -c '{quoted}'
"""
