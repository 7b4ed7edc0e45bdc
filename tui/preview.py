"""Dataset preview for the wizard: file format and columns, one conversation as the trainer tokenises it, packing
efficiency on a sample. Blocking (tokenizer load): call it from a thread worker."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from runner.spec import RunSpec, resolve_embedded

SAMPLE_ROWS_MAX = 2000
SAMPLE_BLOCKS = 8  # sample until this many blocks' worth of tokens, so the padded last block weighs little
SAMPLE_BUDGET_S = 3.0
PREVIEW_TOKENS_MAX = 400


def detect(spec: RunSpec) -> dict[str, Any]:
    """{"file", "format", "columns", "messages_ok"} for a local dataset; {"hub": id} when there is no local path."""
    from runner.preflight import data_file, read_rows

    d = spec.dataset
    if not d.path:
        return {"hub": d.id}
    path = data_file(resolve_embedded(d.path), d.split)
    if path is None:
        raise ValueError(f"no data file under dataset.path {d.path}")
    rows = read_rows(path, 1)
    columns = list(rows[0]) if rows else []
    first = rows[0].get(d.messages_field) if rows else None
    ok = isinstance(first, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in first)
    return {"file": str(path), "format": path.suffix.lstrip(".").lower(), "columns": columns, "messages_ok": ok}


def tokenizer_preview(spec: RunSpec) -> dict[str, Any]:
    """One conversation as (token text, trained?) pairs and PackStats over a sample, through the trainer's own
    tokenisation (runner.train.data) and tokenizer loading (runner.train.model)."""
    from runner.preflight import read_rows
    from runner.train.data import PackStats, has_generation_markers, pack, tokenizer_fn
    from runner.train.model import load_tokenizer

    d = spec.dataset
    info = detect(spec)
    if "hub" in info:
        return {"detect": info}
    tok = load_tokenizer(spec)
    tokenize = tokenizer_fn(tok)  # the trainer's own choice of masking
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

    strategy = spec.train.packing_strategy
    for _ in pack(examples(), seq_len, tok.pad_token_id, stats, strategy=strategy):
        pass
    return {"detect": info, "tokens": tokens, "n_tokens": n_tokens, "n_trained": n_trained,
            "truncated": n_tokens > PREVIEW_TOKENS_MAX, "pack": stats.to_dict(), "seq_len": seq_len,
            "strategy": strategy,
            "template": "generation markers" if has_generation_markers(tok) else "prefix bracketing"}
