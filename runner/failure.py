"""Failure forensics: classify why a rank died, from its exception, its log or torchrun's exit report."""

from __future__ import annotations

import re
import signal
from pathlib import Path

_OOM = re.compile(r"(?:CUDA out of memory|OutOfMemoryError).*?Tried to allocate ([\d.]+ [KMGT]i?B)", re.S)
# runner.train.offload's refusal to page-lock more host memory than the machine has free.
_HOST_OOM = re.compile(r"could not page-lock [^\n]*")
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
    return "exception", last or "unknown error"


def classify_exception(e: BaseException) -> tuple[str, str]:
    if isinstance(e, KeyboardInterrupt):
        return "cancelled", "interrupted"
    text = f"{type(e).__name__}: {e}"
    cause, message = classify_text(text)
    if cause == "exception":
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


def _last_exception_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", ln):
            return ln[:500]
    return lines[-1][:500] if lines else ""


def _last_line_matching(text: str, pattern: re.Pattern[str]) -> str:
    for ln in reversed(text.splitlines()):
        if pattern.search(ln):
            return ln.strip()[:500]
    return ""
