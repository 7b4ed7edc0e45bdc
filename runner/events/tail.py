"""Incremental reader of JSONL event files: complete new lines only, robust to truncation and replacement."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

# A TUI opening a long finished run must stay responsive: one call reads at most this much,
# the next call continues where it stopped.
DEFAULT_MAX_READ_BYTES = 8 * 1024 * 1024

# Only the files of the contract: `rank0.jsonl.tmp` or `rank0.old.jsonl` are not event files.
_EVENT_FILE = re.compile(r"^(rank|node)(\d+)\.jsonl$")


class JsonlTail:
    """Follows one JSONL file; `read_new()` returns the JSON objects of the complete lines appended since the last call.

    A partial last line stays buffered until its newline arrives. A missing file reads as empty. When the file
    shrinks (truncated) or is another file (inode changed: replaced, or deleted and recreated) reading restarts
    from offset 0. Lines that are not JSON objects are skipped and counted in `bad_lines`.
    """

    def __init__(self, path: str | os.PathLike[str], max_read_bytes: int = DEFAULT_MAX_READ_BYTES):
        self.path = Path(path)
        self.max_read_bytes = max_read_bytes
        self.bad_lines = 0
        self._offset = 0
        self._file_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the file the offset refers to
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return []
        with f:
            # fstat of the open descriptor, not stat of the path: the inode checked is the one we read from
            # even if the path is replaced in between.
            st = os.fstat(f.fileno())
            file_id = (st.st_dev, st.st_ino)
            if file_id != self._file_id or st.st_size < self._offset:
                self._file_id = file_id
                self._offset = 0
                self._partial = b""
            if st.st_size == self._offset:
                return []
            f.seek(self._offset)
            data = f.read(self.max_read_bytes)
        self._offset += len(data)
        # Split bytes, not text: a chunk boundary may cut a multi-byte UTF-8 character; only whole lines are decoded.
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [obj for obj in map(self._parse, lines) if obj is not None]

    def _parse(self, line: bytes) -> dict[str, Any] | None:
        line = line.strip()
        if not line:
            return None
        try:
            # json accepts NaN/Infinity: a diverged loss is logged as NaN and must reach the display.
            obj = json.loads(line)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError both
            obj = None
        if not isinstance(obj, dict):
            self.bad_lines += 1
            return None
        return obj


class DirTail:
    """Follows every `rank<r>.jsonl` / `node<n>.jsonl` of an events directory, including files that appear later.

    `read_new()` returns `(source, record)` pairs where source is the file stem ("rank0", "node1"); records of
    one source keep their file order, sources are read in (kind, number) order.
    """

    def __init__(
        self,
        events_dir: str | os.PathLike[str],
        kinds: tuple[str, ...] = ("rank", "node"),
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
    ):
        self.events_dir = Path(events_dir)
        self.kinds = kinds
        self.max_read_bytes = max_read_bytes
        self._tails: dict[str, JsonlTail] = {}
        self._order: list[tuple[str, int, str]] = []  # (kind, number, source), sorted

    @property
    def bad_lines(self) -> int:
        return sum(t.bad_lines for t in self._tails.values())

    def read_new(self) -> list[tuple[str, dict[str, Any]]]:
        self._discover()
        out: list[tuple[str, dict[str, Any]]] = []
        for _, _, source in self._order:
            out.extend((source, rec) for rec in self._tails[source].read_new())
        return out

    def _discover(self) -> None:
        try:
            names = os.listdir(self.events_dir)
        except (FileNotFoundError, NotADirectoryError):
            return
        added = False
        for name in names:
            m = _EVENT_FILE.match(name)
            if m is None or m.group(1) not in self.kinds:
                continue
            source = name[: -len(".jsonl")]
            if source not in self._tails:
                self._tails[source] = JsonlTail(self.events_dir / name, self.max_read_bytes)
                self._order.append((m.group(1), int(m.group(2)), source))
                added = True
        if added:
            self._order.sort()
