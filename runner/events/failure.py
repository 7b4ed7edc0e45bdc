"""Failure forensics: classify why a rank died, from its exception, its log or torchrun's exit report, and which
rank a failed run blames (`diagnose`)."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from runner.events.lines import EndEvent, ErrorEvent, events_of, read_events, step_lines

if TYPE_CHECKING:
    from runner.events.paths import RunPaths


class Failure(TypedDict, total=False):
    """Why a failed run failed (runner.events.failure.diagnose)."""

    rank: int | None
    """The first failing rank; None when torchrun itself died and no rank failed."""
    cause: str
    message: str
    last_step: int
    last_steps: dict[str, int]
    exit_codes: dict[str, int]
    launcher_exit: int
    log: str


_OOM = re.compile(r"(?:CUDA out of memory|OutOfMemoryError).*?Tried to allocate ([\d.]+ [KMGT]i?B)", re.S)
# runner.train.offload's refusal to page-lock more host memory than the machine has free.
# Host memory: too little to page-lock offloaded activations, or a CPU rank's allocation refused (hardware.memory_gib
# caps it; so does the machine).
_HOST_OOM = re.compile(r"could not page-lock [^\n]*|DefaultCPUAllocator: (?:can't allocate memory|not enough memory)"
                       r"[^\n]*")
_NCCL_TIMEOUT = re.compile(r"(Watchdog caught collective operation timeout|NCCL.*timed? ?out|Timeout.*NCCL)", re.I)
_NCCL = re.compile(r"(NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ProcessGroupNCCL)", re.I)
# A collective's transport lost its peer (gloo's "Connection reset by peer ... a remote worker hanging", a closed
# socket): what the surviving ranks raise when another rank died.
_PEER_LOST = re.compile(r"(Connection (?:reset|closed) by peer"
                        r"|remote (?:worker|process|peer)[^\n]*(?:exit|died|hang|clos))", re.I)
PEER_FAILURE_CAUSES = ("peer_lost", "nccl_timeout", "nccl_error")
"""Causes that a rank's error can have because another rank died: they never name the first failure when a rank
was killed."""
# torchrun's failure report: "rank : 1 (local_rank: 1)" ... "exitcode : -9 (pid: 123)"
_REPORT = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def classify_text(text: str) -> tuple[str, str]:
    """(cause, message) from an exception's text or a log tail."""
    m = _OOM.search(text)
    if m:
        return "cuda_oom", f"CUDA out of memory (tried to allocate {m.group(1)})"
    if "out of memory" in text and "CUDA" in text:
        return "cuda_oom", "CUDA out of memory"
    m = _HOST_OOM.search(text)
    if m:
        return "host_oom", m.group(0).strip()[:500]
    if _NCCL_TIMEOUT.search(text):
        return "nccl_timeout", _last_line_matching(text, _NCCL_TIMEOUT) or "NCCL collective timed out"
    if _NCCL.search(text):
        return "nccl_error", _last_line_matching(text, _NCCL) or "NCCL error"
    if _PEER_LOST.search(text):
        return "peer_lost", _last_line_matching(text, _PEER_LOST) or "a peer rank's connection was lost"
    last = _last_exception_line(text)
    return ("exception", last) if last else ("unknown", "no exception or known error in the log")


def classify_exception(e: BaseException) -> tuple[str, str]:
    if isinstance(e, KeyboardInterrupt):
        return "cancelled", "interrupted"
    text = f"{type(e).__name__}: {e}"
    cause, message = classify_text(text)
    if cause in ("exception", "unknown"):  # an exception whose name does not say so is one all the same
        cause = "exception"
        message = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return cause, message[:500]


def signal_cause(exitcode: int) -> tuple[str, str] | None:
    """A negative exit code (torchrun's report) or 128+N means the rank was killed by signal N."""
    num = -exitcode if exitcode < 0 else exitcode - 128 if exitcode > 128 else None
    if num is None:
        return None
    try:
        name = signal.Signals(num).name
    except ValueError:
        name = f"signal {num}"
    return "signal", f"killed by signal {num} ({name})"


def torchrun_exit_codes(launcher_log: str) -> dict[int, int]:
    """Global rank → exit code from torchrun's ChildFailedError report."""
    return {int(rank): int(code) for rank, code in _REPORT.findall(launcher_log)}


def log_tail(path: Path, max_bytes: int = 20_000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


# A rank's lines as torchrun may prefix them ("[rank0]: ", "[default0]:").
_LINE_PREFIX = re.compile(r"^\[(?:rank|default)?\d+\]:\s?")
# An exception as Python prints it: a dotted name, then ": message" or nothing.
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?::\s.*)?$")
_NAMED_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b")


def _last_exception_line(text: str) -> str:
    """The last traceback's exception line (its first line after the frames), else the last line that names an
    exception (`...Error: message`), else "": any other line (a progress bar, a warning) is not the error."""
    lines = [_LINE_PREFIX.sub("", ln).rstrip() for ln in text.splitlines()]  # a progress bar's \r ends a line too
    found, in_traceback = "", False
    for ln in lines:
        if ln.startswith("Traceback (most recent call last):"):
            in_traceback = True
        elif in_traceback and ln and not ln[0].isspace():
            in_traceback = False
            if _EXCEPTION.match(ln):
                found = ln
    if found:
        return found[:500]
    return next((ln.strip()[:500] for ln in reversed(lines) if _NAMED_EXCEPTION.match(ln.strip())), "")


def _last_line_matching(text: str, pattern: re.Pattern[str]) -> str:
    for ln in reversed(text.splitlines()):
        if pattern.search(ln):
            return ln.strip()[:500]
    return ""


def any_error_event(paths: RunPaths, world_size: int) -> bool:
    return any(events_of(read_events(paths.rank_events(r)), ErrorEvent) for r in range(world_size))


def missing_loss(paths: RunPaths, world_size: int, exit_code: int) -> Failure | None:
    """Why a run that exited cleanly still failed: a rank took steps but logged no loss (an engine whose library
    changed what it reports writes steps without the loss, or no step line at all); None when every rank that took
    steps logged one."""
    last_steps: dict[str, int] = {}
    silent: list[tuple[int, int]] = []
    for r in range(world_size):
        evs = read_events(paths.rank_events(r))
        steps = step_lines(evs)
        last_steps[str(r)] = (steps[-1].step or 0) if steps else 0
        ends = events_of(evs, EndEvent)
        took = max([e.steps or 0 for e in ends] + [len(steps)])
        logged = any(e.number("loss") is not None or e.number("global_loss") is not None for e in steps)
        # Early stopping can end a run before train.log_every asked for a line: its eval said the loss.
        stopped_early = any(e.stopped_early is not None for e in ends)
        if took and not logged and not stopped_early:
            silent.append((r, took))
    if not silent:
        return None
    rank, took = silent[0]
    ranks = ", ".join(str(r) for r, _ in silent)
    return {"rank": rank, "cause": "no_loss",
            "message": f"rank{'s' if len(silent) > 1 else ''} {ranks} took {took} steps but logged no loss: the "
                       "engine never reported one, so what the run learned is unknown",
            "last_step": last_steps[str(rank)], "last_steps": last_steps, "exit_codes": {},
            "launcher_exit": exit_code, "log": str(paths.rank_log(rank))}


def diagnose(paths: RunPaths, world_size: int, exit_code: int) -> Failure:
    """The first failing rank, its cause (OOM with size, NCCL, exception line, signal), last steps, log path."""
    launcher_log = log_tail(paths.launcher_log, 200_000)
    codes = torchrun_exit_codes(launcher_log)
    root = _root_cause_rank(launcher_log)
    last_steps: dict[str, int] = {}
    errors: list[tuple[float, int, ErrorEvent]] = []
    for r in range(world_size):
        evs = read_events(paths.rank_events(r))
        steps = step_lines(evs)
        last_steps[str(r)] = (steps[-1].step or 0) if steps else 0  # the last logged, the resumed run's after a resume
        errors += [(e.t or 0.0, r, e) for e in events_of(evs, ErrorEvent)]
    # A rank killed by a signal leaves no error event, and its peers then fail in collectives: prefer it, unless a
    # rank failed first for a reason of its own (not a lost peer). torchrun's "first observed" is only the order
    # in which it noticed the exits, which a fast-exiting peer can win.
    killed = [r for r, c in sorted(codes.items()) if signal_cause(c) and signal_cause(c)[0] == "signal"]
    own_errors = [x for x in errors if x[2].cause not in PEER_FAILURE_CAUSES]
    if killed and (root in killed or root is None or not own_errors):
        rank = root if root is not None and root in killed else killed[0]
        cause, message = signal_cause(codes[rank])  # type: ignore[misc]
    elif exit_code < 0 and not own_errors:
        # torchrun itself was killed: no rank reported why, and a rank's log says nothing about it.
        rank = None
        cause, message = signal_cause(exit_code)  # type: ignore[misc]
        message = f"torchrun (the launcher) {message}; no rank reported an error"
    elif errors:
        errors.sort(key=lambda x: (x[0], x[1]))
        _, rank, ev = errors[0]
        if root is not None and any(r == root for _, r, _ in errors):
            rank, ev = next((r, e) for _, r, e in errors if r == root)
        cause, message = ev.cause or "exception", ev.message or ""
    else:
        rank = root if root is not None else 0
        cause, message = classify_text(log_tail(paths.rank_log(rank)))
        if cause == "unknown":
            cause, message = classify_text(launcher_log)
        if rank in codes and signal_cause(codes[rank]):
            cause, message = signal_cause(codes[rank])  # type: ignore[misc]
    log = paths.rank_log(rank) if rank is not None else paths.launcher_log
    last_step = last_steps.get(str(rank), 0) if rank is not None else max(last_steps.values(), default=0)
    return {"rank": rank, "cause": cause, "message": message, "last_step": last_step,
            "last_steps": last_steps, "exit_codes": {str(k): v for k, v in codes.items()}, "launcher_exit": exit_code,
            "log": str(log)}


def _root_cause_rank(launcher_log: str) -> int | None:
    m = re.search(r"Root Cause \(first observed failure\):\s*\n\s*\[\d+\]:.*?rank\s*:\s*(\d+)", launcher_log, re.S)
    return int(m.group(1)) if m else None
