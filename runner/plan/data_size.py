"""Dataset size: rows and tokens of the spec's dataset, sampled from local files or known from the dataset card."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.facts.catalog import LoadedArch
from runner.plan.constants import (CHARS_PER_TOKEN, DATASET_SAMPLE_ROWS, KNOWN_DATASETS, TEMPLATE_TOKENS_PER_MESSAGE,
                                   WHOLE_FILE_ROWS)
from runner.spec import RunSpec


@dataclass(frozen=True)
class DataSize:
    rows: int | None
    tokens: int | None
    avg_tokens: float | None
    source: str
    lengths: tuple[int, ...] = ()
    """Tokens of each sampled row, in file order (what the packing preview packs)."""
    row_format: dict[str, Any] | None = None
    """The rows' format as runner.data.formats detects it (format, variant, columns, detected)."""
    row_lengths: tuple[int, ...] = ()
    """Tokens of every row in file order (0 for a row that trains nothing), when the sample holds every row of one file:
    what each rank's shard holds, hence the exact steps (runner.plan.timing.shard_steps). Empty otherwise."""

    def attention_len(self, seq_len: int) -> int | None:
        """Σ piece² / Σ piece over the sampled rows cut into pieces of at most seq_len (what packing makes of them):
        the document length that gives a packed block's attention work (Σ doc_len² = tokens × this). A long tail
        weighs in far more than in the mean length: attention grows with the square."""
        pieces = [min(seq_len, n - start) for n in self.lengths for start in range(0, n, seq_len)]
        total = sum(pieces)
        return round(sum(p * p for p in pieces) / total) if total else None


def dataset_size(spec: RunSpec, loaded: LoadedArch) -> DataSize:
    d = spec.dataset
    if d.path:
        from runner.spec import resolve_embedded

        from runner.data.formats import RowFormat

        return _local_size(str(resolve_embedded(d.path)), RowFormat.from_spec(d), str(loaded.config_dir or ""))
    known = KNOWN_DATASETS.get((d.id or "", d.split))
    if known:
        return DataSize(known["rows"], known["tokens"], known["tokens"] / known["rows"], known["source"])
    return DataSize(None, None, None, "")


def _sample_rows(path: str, limit: int = DATASET_SAMPLE_ROWS) -> tuple[list[dict[str, Any]], int]:
    """The first `limit` rows of each local data file (a sample) and the number of rows in all of them."""
    from runner.data.datafiles import data_suffix, is_gzip, open_binary

    p = Path(path)
    files = sorted(x for x in p.rglob("*") if data_suffix(x) in (".jsonl", ".json", ".parquet")) if p.is_dir() else [p]
    rows: list[dict[str, Any]] = []
    n_rows = 0
    for f in files:
        try:
            if data_suffix(f) == ".jsonl":
                # A .gz is read decompressed; past 64 MB its rows are estimated from text compressing about 4×.
                size = f.stat().st_size * (4 if is_gzip(f) else 1)
                with open_binary(f) as fh:
                    head = [line for _, line in zip(range(limit), fh) if line.strip()]
                rows += [json.loads(x) for x in head]
                if f.stat().st_size <= 64 << 20:
                    with open_binary(f) as fh:
                        n_rows += sum(1 for line in fh if line.strip())
                else:
                    n_rows += int(size / max(1.0, sum(map(len, head)) / max(1, len(head))))
            elif data_suffix(f) == ".json":
                with open_binary(f) as fh:
                    data = json.loads(fh.read())
                data = data if isinstance(data, list) else data.get("data", [])
                rows += data[:limit]
                n_rows += len(data)
            else:
                import pyarrow.parquet as pq

                meta = pq.ParquetFile(f)
                n_rows += meta.metadata.num_rows
                rows += meta.read_row_group(0).slice(0, limit).to_pylist()
        except Exception:
            continue
    return rows, n_rows


@functools.lru_cache(maxsize=16)
def _local_size(path: str, row_format: Any, model_dir: str) -> DataSize:
    rows, n_rows = _sample_rows(path)
    if Path(path).is_file() and len(rows) < n_rows <= WHOLE_FILE_ROWS:
        rows, n_rows = _sample_rows(path, n_rows)
    if not rows or not n_rows:
        return DataSize(None, None, None, "")
    from runner.data.formats import FormatError, detect, row_texts

    try:
        found = detect(rows[:16], row_format)
        detected: dict[str, Any] | None = {**found.to_dict(), "summary": found.describe()}
    except FormatError:
        detected = None
    texts: list[str] = []
    owner: list[int] = []  # the row of each text piece
    turns = [0] * len(rows)
    for i, r in enumerate(rows):
        pieces, turns[i] = row_texts(r, row_format) if isinstance(r, dict) else ([], 0)
        texts += pieces
        owner += [i] * len(pieces)
    if not texts:
        return DataSize(n_rows, None, None, "", row_format=detected)
    counts, how = _count_tokens(texts, model_dir)
    lengths = [TEMPLATE_TOKENS_PER_MESSAGE * n for n in turns]
    for i, n in zip(owner, counts):
        lengths[i] += n
    per_row = sum(lengths) / len(rows)
    every_row = len(rows) == n_rows and Path(path).is_file()
    # The packer skips a row that trains nothing (no trained turn): it makes no block.
    trained = tuple(n if _has_targets(r, row_format) else 0 for r, n in zip(rows, lengths)) if every_row else ()
    return DataSize(n_rows, int(per_row * n_rows), per_row, f"{how} over {len(rows)} of {n_rows} rows",
                    tuple(n for n in lengths if n), detected, trained)


def _has_targets(row: Any, row_format: Any) -> bool:
    from runner.data.formats import FormatError, detect, to_sample

    try:
        return isinstance(row, dict) and to_sample(row, detect([row], row_format), row_format).has_targets
    except FormatError:
        return False


def _count_tokens(texts: list[str], model_dir: str) -> tuple[list[int], str]:
    """Tokens of each text: with the model's tokenizer when its folder has one, else 4 characters a token."""
    tok_file = Path(model_dir) / "tokenizer.json" if model_dir else None
    if tok_file and tok_file.is_file():
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(tok_file))
            return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)], "model tokenizer"
        except Exception:
            pass
    return [int(len(x) / CHARS_PER_TOKEN) for x in texts], "chars/4"



def _without_nulls(value: Any) -> Any:
    """A row as a stable key: the streaming reader fills keys missing from a row with None, the sample does not."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def reader_lengths(spec: RunSpec, data: DataSize, readers: int) -> list[list[int]] | None:
    """Tokens of the rows each of `readers` reads, in its order, through the rank's own reader (so a plan shards
    and shuffles as the run does); None when a row it reads is not one the sample measured."""
    from runner.spec import resolve_embedded

    path = resolve_embedded(spec.dataset.path)
    out = _reader_lengths(str(path), path.stat().st_mtime_ns, spec.dataset.split, spec.train.seed, readers,
                          data.row_lengths)
    return None if out is None else [list(x) for x in out]


@functools.lru_cache(maxsize=16)
def _reader_lengths(path: str, mtime_ns: int, split: str, seed: int, readers: int,
                    row_lengths: tuple[int, ...]) -> tuple[tuple[int, ...], ...] | None:
    from runner.data.shard import load_examples

    rows, _ = _sample_rows(path, len(row_lengths))
    length = {json.dumps(_without_nulls(r), sort_keys=True, default=str): n for r, n in zip(rows, row_lengths)}
    out = []
    for reader in range(readers):
        ds = load_examples(Path(path), None, None, split, reader, readers, seed)
        keys = [json.dumps(_without_nulls(dict(r)), sort_keys=True, default=str) for r in ds]
        if any(k not in length for k in keys):
            return None
        out.append(tuple(length[k] for k in keys if length[k]))
    return tuple(out)
