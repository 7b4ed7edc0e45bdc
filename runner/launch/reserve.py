"""Disk held for the record from a run's start, given back to finish it, and the failure a full disk caused."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from runner.events.failure import log_tail
from runner.events.paths import RunPaths
from runner.gate.disk import RESERVE_BYTES, free_bytes, human

RESERVE_FILE = ".disk-reserve"
# Free bytes below which a failed run's folder counts as full: a filesystem refuses the write that would take its
# last page, so what is left after ENOSPC is less than one write.
FULL_BELOW = 256 << 10
_ENOSPC = re.compile(r"No space left on device|\[Errno 28\]|ENOSPC|file write failed")


class DiskReserve:
    """Files that hold RESERVE_BYTES / 2 in the run folder and the records folder until the record is written:
    when the ranks fill the disk, releasing them gives the supervisor room for the record and its state file."""

    def __init__(self, run_dir: Path, records_dir: Path):
        # The records folder is shared by runs: each holds its own file there.
        self.files = [Path(run_dir) / RESERVE_FILE, Path(records_dir) / f".{Path(run_dir).name}{RESERVE_FILE}"]
        self.held: list[Path] = []

    def hold(self) -> None:
        for f in self.files:
            try:
                f.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    # Allocated blocks, not a sparse file: tmpfs and ext4 both count them as used.
                    os.posix_fallocate(fd, 0, RESERVE_BYTES // 2)
                finally:
                    os.close(fd)
                self.held.append(f)
            except OSError:  # no room even for this: the run's own check said so unless --force; go on without
                f.unlink(missing_ok=True)

    def release(self, all_files: bool = False) -> None:
        """Give the space back; all_files: also what a supervisor that died left held."""
        for f in self.files if all_files else self.held:
            f.unlink(missing_ok=True)
        self.held = []


def disk_full_failure(failure: dict[str, Any], paths: RunPaths, free_at_end: int | None) -> dict[str, Any]:
    """The failure with cause "disk full" when the disk filled up (ENOSPC in a rank's error or log, or the run
    folder's filesystem had less than a write left when the ranks died): which folder, how much was free."""
    texts = [str(failure.get("message") or ""), log_tail(paths.launcher_log)]
    texts += [log_tail(p) for p in sorted(paths.logs.glob("rank*.log"))] if paths.logs.is_dir() else []
    full = any(_ENOSPC.search(t) for t in texts) or (free_at_end is not None and free_at_end < FULL_BELOW)
    if not full:
        return failure
    folder, _ = free_bytes(paths.run_dir)
    free = "unknown" if free_at_end is None else f"{human(free_at_end)} ({free_at_end} bytes)"
    return {**failure, "cause": "disk full",
            "message": f"no space left on the filesystem of {folder}: {free} free when the ranks stopped; free "
                       f"space there (or move the run folder), then `runner run --resume {paths.run_dir}` "
                       "continues from the last complete checkpoint"}
