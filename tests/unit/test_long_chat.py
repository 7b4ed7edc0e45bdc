"""benchmarks/make_long_chat.py: conversations of the peer figures' lengths, reproducibly."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("make_long_chat", REPO / "benchmarks" / "make_long_chat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_lengths_are_in_range_and_the_file_is_reproducible(tmp_path):
    make = _module().make
    lengths = make(tmp_path / "a.jsonl", rows=30, min_tokens=400, max_tokens=3000)
    assert len(lengths) == 30 and all(400 * 0.9 <= n <= 3000 for n in lengths)
    assert max(lengths) - min(lengths) > 1000  # spread over the range, not one length
    make(tmp_path / "b.jsonl", rows=30, min_tokens=400, max_tokens=3000)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant"]
