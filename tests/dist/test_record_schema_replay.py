"""Replays across record schemas, for real (2 gloo ranks): a schema-1 record written before schema 2 replays exactly,
a schema-2 record's engine decisions are what the replayed ranks decide, even where today's rules would decide
otherwise, and a schema-3 record's whole decisions file is what the replay's ranks are given."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runner.events.lines import TrainBeginEvent, first_event, read_events
from runner.record import records
from runner.record.replay import OTHER_CPU_TOLERANCE
from tests.conftest import dir_args, last_json, run_cli

pytestmark = pytest.mark.dist

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "record_schema1"


def test_a_schema1_record_replays_exactly(dirs, capsys):
    dirs["records"].mkdir(parents=True)
    path = shutil.copy(FIXTURE / "record.json", dirs["records"] / "old.json")
    code, out, _ = run_cli(["replay", str(path), "--json", "--plain", *dir_args(dirs)], capsys)
    result = last_json(out)
    assert code == 0, out
    assert result["reproduced"] is True
    assert result["pinned"] == {}  # two ranks, and schema 1 holds no other decision: today's rules decide
    replay = records.load(Path(result["record"]))
    assert replay["schema"] == "sft-tui.record/3" and "migrated_from" not in replay
    # Bit for bit on the CPU model it was recorded on (an Intel Xeon); on another, within OTHER_CPU_TOLERANCE, and
    # the replay says why.
    if replay["pins"]["system"]["cpu"] == records.load(path)["pins"]["system"]["cpu"]:
        assert result["max_abs_loss_diff"] == 0.0
        assert replay["metrics"]["loss_curve"] == records.load(path)["metrics"]["loss_curve"]
    else:
        assert 0.0 <= result["max_abs_loss_diff"] <= OTHER_CPU_TOLERANCE
        assert "replays bit for bit on its own CPU model only" in result["message"]
        assert any(r["pin"] == "cpu" and r["strict"] is False for r in result["drift"])
    # The replay, run today, records the decisions its ranks were given.
    assert replay["decisions"]["attn"] == "sdpa" and replay["decisions"]["loss_impl"] == "chunked"
    assert replay["decisions"]["fsdp"] is True


def test_replay_runs_with_the_recorded_decisions(dirs, capsys):
    """A schema-2 record whose run chose eager attention and the full loss: the replay's ranks use them, where
    today's rules for its `auto` spec pick sdpa and the chunked loss (the replay above shows it)."""
    rec = records.load(FIXTURE / "record.json")
    rec["spec"]["train"]["max_steps"] = 2
    rec.update(id="pinned", decisions={"attn": "eager", "loss_impl": "full", "fsdp_sharded": True})
    path = dirs["records"] / "pinned.json"
    records.save(path, rec)
    code, out, _ = run_cli(["replay", str(path), "--json", "--plain", *dir_args(dirs)], capsys)
    result = last_json(out)
    assert result["status"] == "succeeded", out
    assert result["pinned"] == {"model.attn_implementation": "eager", "train.loss_impl": "full"}
    replay = records.load(Path(result["record"]))
    begin = first_event(read_events(Path(replay["run_dir"]) / "events" / "rank0.jsonl"), TrainBeginEvent)
    assert (begin.attn, begin.loss_impl) == ("eager", "full")
    assert (replay["decisions"]["attn"], replay["decisions"]["loss_impl"]) == ("eager", "full")

    # That replay's record (schema 3) holds its whole decisions file: a replay of it gives its ranks that file, not
    # what today's rules would decide (here a reason no rule writes, echoed by every rank).
    rec = records.load(Path(result["record"]))
    rec["decisions"] = {**rec["decisions"], "attn_reason": "as recorded"}
    rec.update(id="whole")
    path = dirs["records"] / "whole.json"
    records.save(path, rec)
    code, out, err = run_cli(["replay", str(path), "--json", "--plain", *dir_args(dirs)], capsys)
    result = last_json(out)
    assert result["status"] == "succeeded" and result["reproduced"] is True, out
    assert "engine decisions pinned from the record: all (its decisions file)" in out + err
    replay = records.load(Path(result["record"]))
    assert replay["decisions"] == rec["decisions"]
    from tests.unit.test_decide import assert_ranks_obeyed

    assert assert_ranks_obeyed(Path(replay["run_dir"])).attn_reason == "as recorded"
