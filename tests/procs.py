"""Real processes in tests: start `runner`, wait until a rank has logged a step, hold processes still, and prove a
process tree is gone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from runner.events.lines import read_events

REPO = Path(__file__).resolve().parents[1]


def start_runner(args: list[str], **kw: Any) -> subprocess.Popen:
    """`python -m runner ARGS` from the repository root, its output captured as text."""
    return subprocess.Popen([sys.executable, "-m", "runner", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def wait_for_step(runs: Path, step: int, rank: int = 0, timeout_s: float = 120) -> tuple[Path, int]:
    """(run folder, the rank's pid) once `rank` of a run under `runs` has logged `step`."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for run_dir in runs.glob("*"):
            evs = read_events(run_dir / "events" / f"rank{rank}.jsonl")
            start = next((e for e in evs if e.get("event") == "start"), None)
            if start and any(e.get("step", 0) >= step and "event" not in e for e in evs):
                return run_dir, start["pid"]
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never reached step {step} within {timeout_s} s")


def wait_until(cond: Callable[[], Any], what: str, timeout_s: float = 60) -> Any:
    """cond()'s first true value, polled until timeout_s."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout_s} s")


@contextlib.contextmanager
def held(pids: list[int]) -> Iterator[None]:
    """The processes stopped (SIGSTOP) inside the block and continued after it, whatever happens there: a stop
    requested meanwhile lands mid-run however slow the machine is, so a short run will do."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants now (empty when it is gone)."""
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(procs: list[psutil.Process]) -> list[tuple[int, list[str]]]:
    """(pid, command line) of those still running (a zombie has exited)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append((p.pid, p.cmdline()))
        except psutil.NoSuchProcess:
            pass
    return out


def wait_all_gone(procs: list[psutil.Process], within_s: float) -> None:
    deadline = time.time() + within_s
    while alive(procs) and time.time() < deadline:
        time.sleep(0.2)
    assert alive(procs) == [], f"processes left running after {within_s} s: {alive(procs)}"
