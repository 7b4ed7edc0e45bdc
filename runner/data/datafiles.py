"""Local dataset files: which file to sample, and its rows read with errors that name the file and the line.

A JSONL, JSON or CSV file may be gzip-compressed (`rows.jsonl.gz`): it is read as the plain file would be, here and
in the ranks' stream (the `datasets` builders decompress it too).

No torch: preflight, the row formats and the wizard read data files before any rank starts.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from pathlib import Path
from typing import IO, Any

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
GZIP_SUFFIXES = (".jsonl", ".json", ".csv")  # the text formats that may come as <name><suffix>.gz


def data_suffix(path: Path) -> str:
    """The file's data format as a suffix, a trailing .gz looked through: `.jsonl` for `rows.jsonl.gz`."""
    suffixes = [x.lower() for x in path.suffixes]
    if len(suffixes) >= 2 and suffixes[-1] == ".gz" and suffixes[-2] in GZIP_SUFFIXES:
        return suffixes[-2]
    return path.suffix.lower()


def is_gzip(path: Path) -> bool:
    return path.suffix.lower() == ".gz"


def data_stem(path: Path) -> str:
    """The file name without its data suffix (and .gz): what a split name is matched against."""
    name = path.name[:-3] if is_gzip(path) else path.name
    return name[: len(name) - len(data_suffix(path))] if data_suffix(path) else name


def data_file(path: Path, split: str) -> Path | None:
    """The file to sample for a local dataset: the file itself, or the split's (else the first) data file."""
    if path.is_file():
        return path
    files = sorted(p for p in path.rglob("*") if p.is_file() and data_suffix(p) in DATA_SUFFIXES)
    return next((p for p in files if split in data_stem(p)), files[0] if files else None)


class DataFileError(ValueError):
    """A data file that does not parse: the message names the file and the 1-based line."""


GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)
"""What reading a damaged .gz raises (a bad header, a truncated stream, corrupt data)."""


GZIP_FIX = "check it with `gzip -t`, then recompress it or give the uncompressed file"


def gzip_error(path: Path, e: BaseException, with_fix: bool = True) -> DataFileError:
    said = f"{path}: not a readable gzip file ({e or type(e).__name__})"
    return DataFileError(f"{said}; {GZIP_FIX}" if with_fix else said)


def open_binary(path: Path) -> IO[bytes]:
    """The file's bytes, decompressed on the fly when it ends in .gz."""
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


def open_text(path: Path, errors: str = "strict", newline: str | None = None) -> IO[str]:
    """The file as UTF-8 text, decompressed on the fly when it ends in .gz. A leading byte-order mark is dropped
    (utf-8-sig), as `datasets` and pandas do: editors on Windows write one, and the first row is a good row."""
    if is_gzip(path):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", errors=errors, newline=newline)
    return open(path, encoding="utf-8-sig", errors=errors, newline=newline)


def _jsonl_row(line: str, path: Path, n: int) -> Any:
    try:
        # The line's own end is no part of the row: left in, an unterminated string reads as a control character.
        return json.loads(line.rstrip("\r\n"))
    except json.JSONDecodeError as e:
        # json's messages may end in "at" ("Unterminated string starting at"): the column follows without another.
        at = " " if e.msg.endswith(" at") else " at "
        raise DataFileError(f"{path}: line {n} is not valid JSON ({e.msg}{at}column {e.colno})") from None


def read_rows(path: Path, limit: int) -> list[dict[str, Any]]:
    """The first `limit` rows of a data file; a damaged .gz is a DataFileError naming the file."""
    try:
        return _read_rows(path, limit)
    except GZIP_ERRORS as e:
        raise gzip_error(path, e) from None


def _read_rows(path: Path, limit: int) -> list[dict[str, Any]]:
    suffix = data_suffix(path)
    if suffix == ".jsonl":
        rows = []
        with open_text(path) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    rows.append(_jsonl_row(line, path, n))
                if len(rows) >= limit:
                    break
        return rows
    if suffix == ".json":
        try:
            with open_text(path) as f:
                data = json.loads(f.read())
        except json.JSONDecodeError as e:
            raise DataFileError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno} ({e.msg})") from None
        if isinstance(data, dict):
            data = next((v for v in data.values() if isinstance(v, list)), [data])
        return list(data)[:limit]
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).read_row_group(0).slice(0, limit).to_pylist()
    if suffix == ".csv":
        import csv

        with open_text(path, newline="") as f:
            return [row for _, row in zip(range(limit), csv.DictReader(f))]
    raise ValueError(f"unsupported dataset file type {suffix!r}")


def bad_jsonl_line(path: Path) -> tuple[str, str] | None:
    """The first line of a JSONL file that is not UTF-8 or not a JSON object, as (what is wrong, the fix); None when
    every line is one.

    The whole file is read as bytes: the ranks stream all of it, and a bad line anywhere kills them mid-run (a
    byte that is not UTF-8 as a UnicodeDecodeError naming no line). A damaged .gz is reported the same way."""
    try:
        return _bad_jsonl_line(path)
    except GZIP_ERRORS as e:
        return str(gzip_error(path, e, with_fix=False)), GZIP_FIX


def _bad_jsonl_line(path: Path) -> tuple[str, str] | None:
    with open_binary(path) as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                return not_utf8(path, n, raw, e)
            if not line.strip():
                continue
            try:
                row = _jsonl_row(line, path, n)
            except DataFileError as e:
                return str(e), "fix or remove that line"
            if not isinstance(row, dict):
                return f"{path}: line {n} is a JSON {type(row).__name__}, not an object of columns", \
                    "make that line one JSON object ({\"messages\": [...]}) or remove it"
    return None


def not_utf8(path: Path, n: int, raw: bytes, e: UnicodeDecodeError) -> tuple[str, str]:
    """A line that is not UTF-8, named with its byte, and the command that re-encodes the file (Latin-1 is the usual
    source: a byte such as 0xe4 for 'ä')."""
    out = path.with_name(f"{data_stem(path)}.utf8{data_suffix(path)}")
    if is_gzip(path):
        command = f"zcat {path} | iconv -f latin1 -t utf-8 > {out}"
    else:
        command = f"iconv -f latin1 -t utf-8 {path} > {out}"
    return (f"{path}: line {n} is not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})",
            f"re-encode the file as UTF-8, e.g. from Latin-1: `{command}`, and point dataset.path at {out.name}")
