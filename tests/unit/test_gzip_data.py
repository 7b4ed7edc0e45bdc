"""A local .jsonl.gz / .json.gz reads as the plain file everywhere: preflight, format detection, the wizard's
preview, the estimator and the ranks' stream (a damaged one is refused before launch: tests/unit/test_preflight.py)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import pytest

from runner.data.datafiles import data_file, data_suffix, read_rows
from runner.spec import load_spec

CHAT = Path(__file__).resolve().parents[2] / "recipes" / "embedded" / "data" / "chat.jsonl"


@pytest.fixture
def files(tmp_path):
    plain = tmp_path / "plain" / "chat.jsonl"
    plain.parent.mkdir()
    shutil.copy(CHAT, plain)
    packed = tmp_path / "gz" / "chat.jsonl.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(CHAT.read_bytes()))
    rows = [json.loads(x) for x in CHAT.read_text().splitlines()[:50]]
    as_json = tmp_path / "rows.json.gz"
    as_json.write_bytes(gzip.compress(json.dumps(rows).encode()))
    return plain, packed, as_json, rows


def test_rows_formats_and_folders_look_through_gzip(files, tmp_path):
    from runner.gate.preview import detect

    plain, packed, as_json, rows = files
    assert [data_suffix(p) for p in (plain, packed, as_json, Path("x.tar.gz"))] == [".jsonl", ".jsonl", ".json", ".gz"]
    assert read_rows(packed, 50) == read_rows(plain, 50) == read_rows(as_json, 50) == rows
    assert data_file(packed.parent, "train") == packed  # a folder of compressed files
    (packed.parent / "test.jsonl.gz").write_bytes(packed.read_bytes())
    assert data_file(packed.parent, "test").name == "test.jsonl.gz"  # the split matched inside the .gz name
    shown = [detect(load_spec("tiny-cpu", [f"dataset.path={p}"])) for p in (plain, packed)]
    assert shown[1]["format"] == "jsonl.gz" and shown[1]["file"] == str(packed)
    assert {**shown[0], "format": "", "file": ""} == {**shown[1], "format": "", "file": ""}


def test_a_gz_file_estimates_as_the_plain_one(files):
    from runner.plan import estimate

    plain, packed, _, _ = files
    a, b = (dataclasses.asdict(estimate(load_spec("tiny-cpu", [f"dataset.path={p}"]), suggest=False))
            for p in (plain, packed))
    assert a["packing"] and a["dataset_tokens"]
    assert a == b


def test_a_gz_file_streams_the_same_blocks(files):
    """The ranks' data path (both engines build their blocks with it): the same blocks from either file."""
    from runner.gate.preflight import preflight
    from runner.train.data import BlockStream, DataSource
    from runner.train.model import load_tokenizer

    plain, packed, _, _ = files
    spec = load_spec("tiny-cpu", [f"dataset.path={packed}"])
    preflight(spec)
    tok = load_tokenizer(spec)
    blocks = []
    for path in (plain, packed):
        source = DataSource(path=path, dataset_id=None, revision=None, split="train", messages_field="messages",
                            seq_len=256, pad_id=tok.pad_token_id, packing=True, seed=0, epochs=1.0,
                            packing_strategy="bfd")
        blocks.append(list(BlockStream(source, tok, rank=1, world_size=2)))
    assert len(blocks[0]) == len(blocks[1]) > 10
    for x, y in zip(*blocks):
        assert x.input_ids.equal(y.input_ids) and x.labels.equal(y.labels) and x.cu_seqlens.equal(y.cu_seqlens)
