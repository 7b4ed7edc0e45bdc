"""Dataset preview for the wizard: file format and columns, one conversation as the trainer tokenises it, packing
efficiency on a sample. Blocking (tokenizer load): call it from a thread worker."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

from runner.spec import RunSpec, resolve_embedded

SAMPLE_ROWS_MAX = 2000
SAMPLE_BLOCKS = 8  # sample until this many blocks' worth of tokens, so the padded last block weighs little
SAMPLE_BUDGET_S = 3.0
PREVIEW_TOKENS_MAX = 400
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def data_file(path: Path, split: str) -> Path:
    """The file to read for a local dataset path: the file itself, or the split's (else the first) data file of a
    directory."""
    if path.is_file():
        return path
    files = sorted(p for p in path.rglob("*") if p.suffix.lower() in DATA_SUFFIXES)
    if not files:
        raise ValueError(f"no {'/'.join(DATA_SUFFIXES)} file under {path}")
    for p in files:
        if split in p.stem:
            return p
    return files[0]


def read_rows(path: Path, limit: int) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    rows: list[dict[str, Any]] = []
    if suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            for line in f:
                if len(rows) >= limit:
                    break
                line = line.strip()
                if line:
                    obj = json.loads(line)
                    if isinstance(obj, dict):
                        rows.append(obj)
    elif suffix == ".json":
        obj = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(obj, dict):  # {"data": [...]} or {"train": [...]}
            obj = next((v for v in obj.values() if isinstance(v, list)), [obj])
        rows = [r for r in obj[:limit] if isinstance(r, dict)]
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path).iter_batches(batch_size=min(limit, 1024))
        for batch in table:
            rows.extend(batch.to_pylist())
            if len(rows) >= limit:
                break
        rows = rows[:limit]
    elif suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            rows = [dict(r) for _, r in zip(range(limit), csv.DictReader(f))]
    else:
        raise ValueError(f"unsupported dataset file type {suffix!r} (expected one of {', '.join(DATA_SUFFIXES)})")
    return rows


def detect(spec: RunSpec) -> dict[str, Any]:
    """{"file", "format", "columns", "messages_ok"} for a local dataset; {"hub": id} when there is no local path."""
    d = spec.dataset
    if not d.path:
        return {"hub": d.id}
    path = data_file(resolve_embedded(d.path), d.split)
    rows = read_rows(path, 1)
    columns = list(rows[0]) if rows else []
    first = rows[0].get(d.messages_field) if rows else None
    ok = isinstance(first, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in first)
    return {"file": str(path), "format": path.suffix.lstrip(".").lower(), "columns": columns, "messages_ok": ok}


def tokenizer_preview(spec: RunSpec) -> dict[str, Any]:
    """One conversation as (token text, trained?) pairs and PackStats over a sample, through the trainer's own
    tokenisation (runner.train.data) and tokenizer loading (runner.train.model)."""
    from runner.train.data import PackStats, has_generation_markers, pack, tokenize_sft, tokenize_sft_generation
    from runner.train.model import load_tokenizer

    d = spec.dataset
    info = detect(spec)
    if "hub" in info:
        return {"detect": info}
    tok = load_tokenizer(spec)
    tokenize = tokenize_sft_generation if has_generation_markers(tok) else tokenize_sft
    rows = read_rows(Path(info["file"]), SAMPLE_ROWS_MAX)
    convs = [r.get(d.messages_field) for r in rows]
    convs = [c for c in convs if isinstance(c, list)]
    shown = next((c for c in convs if any(isinstance(m, dict) and m.get("role") == "assistant" for m in c)), None)
    tokens: list[tuple[str, bool]] = []
    n_tokens = n_trained = 0
    if shown is not None:
        ids, mask = tokenize(tok, shown)
        n_tokens, n_trained = len(ids), sum(mask)
        tokens = [(tok.decode([i]), bool(m)) for i, m in zip(ids[:PREVIEW_TOKENS_MAX], mask[:PREVIEW_TOKENS_MAX])]
    stats = PackStats()
    seq_len = spec.train.seq_len
    want_tokens = SAMPLE_BLOCKS * seq_len
    deadline = time.monotonic() + SAMPLE_BUDGET_S

    def examples():
        seen = 0
        for conv in convs:
            if seen >= want_tokens or time.monotonic() > deadline:
                return
            ids, mask = tokenize(tok, conv)
            seen += len(ids)
            yield ids, mask

    for _ in pack(examples(), seq_len, tok.pad_token_id, stats):
        pass
    return {"detect": info, "tokens": tokens, "n_tokens": n_tokens, "n_trained": n_trained,
            "truncated": n_tokens > PREVIEW_TOKENS_MAX, "pack": stats.to_dict(), "seq_len": seq_len,
            "template": "generation markers" if has_generation_markers(tok) else "prefix bracketing"}
