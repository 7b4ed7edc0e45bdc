"""The bench data (recipes/embedded/data/long-chat.jsonl.gz, made by benchmarks/make_long_chat.py): its lengths
follow the documented distribution, measured with the embedded tokenizer, and the generator makes it reproducibly."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "recipes" / "embedded" / "data" / "long-chat.jsonl.gz"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("make_long_chat", REPO / "benchmarks" / "make_long_chat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_shipped_file_has_the_documented_lengths(gen):
    convs = gen.read(SHIPPED)
    st = gen.stats(convs, gen.templated_lengths(gen.load_tokenizer(), convs))
    assert st["rows"] == 2000 and st["tokens"] >= 2_500_000  # bfd buffers 64 blocks of 32,768 before the first
    assert 1000 <= st["p50"] <= 1500 and 1500 <= st["mean"] <= 2000
    assert st["share_over_8192"] >= 0.02 and st["max"] <= 32768
    pairs = st["turn_pairs"]
    assert set(pairs) == {1, 2, 3, 4, 5, 6} and sum(pairs.values()) - pairs[1] >= 0.4 * st["rows"]
    assert 0 < st["with_system"] < st["rows"]
    # The figures the module docstring states are the file's.
    assert gen.describe(st).replace("\n", "\n    ") in gen.__doc__
    assert SHIPPED.stat().st_size <= 3_000_000


def test_the_generator_makes_the_shipped_file_and_the_same_bytes_again(gen, tmp_path):
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    gen.make(a, rows=40)
    gen.make(b, rows=40)
    assert a.read_bytes() == b.read_bytes()
    # Rows are drawn one after another from one seeded stream: the first 40 of the shipped file are these.
    with gzip.open(SHIPPED, "rt") as f:
        head = [next(f) for _ in range(40)]
    assert gzip.decompress(a.read_bytes()).decode().splitlines(keepends=True) == head


def test_the_earlier_uniform_set_is_still_made_the_same_way(gen, tmp_path):
    """Committed results were measured on it (`--uniform 400:3000 --rows 1200`); rebuilt by the estimator tests."""
    lengths = gen.make_uniform(tmp_path / "u.jsonl", rows=30, min_tokens=400, max_tokens=3000)
    assert len(lengths) == 30 and all(400 * 0.9 <= n <= 3000 for n in lengths)
    rows = [json.loads(line) for line in (tmp_path / "u.jsonl").read_text().splitlines()]
    assert [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant"]
