"""The steps `runner estimate` plans are the steps a real run executes: both engines, packed and not.

One epoch of a 30-row slice of the embedded chat data: the ranks' shards differ (one row trains nothing, a rank
packs one block more than the other), so the plan must shard, skip and pack as the ranks do, and apply each
engine's rule for ranks with unequal blocks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.record import records
from runner.spec import resolve_embedded
from tests.conftest import dir_args, last_json, run_cli

pytestmark = pytest.mark.dist

ROWS = 30


@pytest.fixture(scope="module")
def data_slice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = resolve_embedded("embedded:data/chat.jsonl")
    path = tmp_path_factory.mktemp("slice") / "chat30.jsonl"
    path.write_text("".join(src.read_text().splitlines(keepends=True)[:ROWS]))
    return path


@pytest.mark.parametrize("engine,packing", [("native", True), ("native", False), ("trl", True), ("trl", False)])
def test_planned_steps_equal_executed_steps(engine, packing, data_slice, dirs, capsys):
    sets = ["--set", f"dataset.path={data_slice}", "--set", "train.max_steps=null", "--set", "train.epochs=1",
            "--set", f"engine={engine}", "--set", f"train.packing={str(packing).lower()}",
            "--set", "train.seq_len=128", "--set", "train.log_every=100"]
    code, out, err = run_cli(["estimate", "tiny-cpu", *sets, "--json"], capsys)
    assert code == 0, err
    planned = json.loads(out)["steps"]
    code, out, _ = run_cli(["run", "tiny-cpu", *sets, "--json", "--plain", *dir_args(dirs)], capsys)
    assert code == 0, out
    executed = records.load(Path(last_json(out)["record"]))["metrics"]["steps"]
    assert planned == executed, (engine, packing, planned, executed)
