"""The launcher process tree: torchrun in a session of its own, stopped as a whole (SIGINT, SIGTERM, SIGKILL)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from runner.events.paths import RunPaths
from runner.lifetime import signal_on_parent_death
from runner.launch.command import run_env


class Launcher:
    """torchrun as a child in its own process group; cancel escalates SIGINT → SIGTERM → SIGKILL."""

    def __init__(self, argv: list[str], paths: RunPaths, env: dict[str, str] | None = None,
                 stop_with_parent: bool = False):
        self.argv = argv
        # torchrun gets SIGTERM (a graceful stop with a checkpoint) when the process that started it dies, even by
        # SIGKILL: only for a launching main thread that lives as long as the run (the supervisor's).
        self.stop_with_parent = stop_with_parent
        self.paths = paths
        self.env = env if env is not None else run_env()
        self.proc: subprocess.Popen[bytes] | None = None
        self.cancelled = False
        self.graceful = False  # stopped with a checkpoint (SIGTERM first), not cancelled
        self._log = None

    def start(self) -> None:
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        self._log = open(self.paths.launcher_log, "ab")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.env, start_new_session=True,
                                     preexec_fn=_launcher_preexec(os.getpid() if self.stop_with_parent else None))

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
        """Cancel the whole run: torchrun forwards SIGINT to the ranks (they stop at a step boundary)."""
        self.cancelled = True
        return self.terminate(grace_s)

    def stop(self, grace_s: float = 25.0) -> int:
        """Stop the whole run gracefully: torchrun forwards SIGTERM, the ranks checkpoint and stop at a step
        boundary; whatever is left after the grace gets SIGKILL (everything gone within 30 s)."""
        self.graceful = self.graceful or not self.cancelled
        self.cancelled = True
        return self.terminate(grace_s, first=signal.SIGTERM)

    def terminate(self, grace_s: float = 30.0, first: int = signal.SIGINT) -> int:
        assert self.proc is not None
        # torchrun starts every rank in a session of its own, so collect the whole tree before signalling:
        # killing only torchrun's group would orphan the ranks.
        tree = self._tree()
        steps = ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)) if first == signal.SIGINT \
            else ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0))
        for sig, wait_s in steps:
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


def ignore_preemption_warning() -> None:
    """SIGUSR1 ignored in this process and, through exec, in what it starts until that sets its own handler.
    SLURM signals every process of a job step (`scancel --signal=USR1`, srun passing on the batch shell's warning),
    and a process without a handler dies of it: only the supervisor and the ranks act on the warning."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def _launcher_preexec(parent: int | None):
    """A preexec function for torchrun: the preemption warning ignored (torchrun has no handler for it; the ranks
    set theirs), and with `parent`, SIGTERM (torchrun's graceful stop) when the parent dies."""

    def preexec() -> None:
        ignore_preemption_warning()
        if parent is not None:
            signal_on_parent_death(signal.SIGTERM, parent)

    return preexec


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


def ranks_alive(paths: RunPaths) -> bool:
    """Whether a rank of this run still runs on this host (from the pids its start events name): after the
    supervisor died, ranks stop on their own at the next step boundary; the record waits for that."""
    import psutil

    from runner.events.lines import read_events

    host = socket.gethostname()
    for path in sorted(paths.events.glob("rank*.jsonl")):
        starts = [e for e in read_events(path) if e.get("event") == "start"]
        if not starts or starts[-1].get("host") not in (None, host) or not starts[-1].get("pid"):
            continue
        try:
            p = psutil.Process(int(starts[-1]["pid"]))
            if p.status() != psutil.STATUS_ZOMBIE and "runner.train" in " ".join(p.cmdline()):
                return True
        except (psutil.Error, ValueError, TypeError):
            continue
    return False
