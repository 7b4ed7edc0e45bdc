"""Local dataset files: which file to sample, and its rows read with errors that name the file and the line.

No torch: preflight, the row formats and the wizard read data files before any rank starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def data_file(path: Path, split: str) -> Path | None:
    """The file to sample for a local dataset: the file itself, or the split's (else the first) data file."""
    if path.is_file():
        return path
    files = sorted(p for p in path.rglob("*") if p.suffix.lower() in DATA_SUFFIXES)
    return next((p for p in files if split in p.stem), files[0] if files else None)


class DataFileError(ValueError):
    """A data file that does not parse: the message names the file and the 1-based line."""


def _jsonl_row(line: str, path: Path, n: int) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise DataFileError(f"{path}: line {n} is not valid JSON ({e.msg} at column {e.colno})") from None


def read_rows(path: Path, limit: int) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    rows.append(_jsonl_row(line, path, n))
                if len(rows) >= limit:
                    break
        return rows
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
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

        with open(path, encoding="utf-8", newline="") as f:
            return [row for _, row in zip(range(limit), csv.DictReader(f))]
    raise ValueError(f"unsupported dataset file type {suffix!r}")


def bad_jsonl_line(path: Path) -> str | None:
    """The first line of a JSONL file that is not a JSON object, as a sentence; None when every line is one.

    The whole file is read: the ranks stream all of it, and a bad line anywhere kills them mid-run."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = _jsonl_row(line, path, n)
            except DataFileError as e:
                return str(e)
            if not isinstance(row, dict):
                return f"{path}: line {n} is a JSON {type(row).__name__}, not an object of columns"
    return None
