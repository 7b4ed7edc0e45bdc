"""Record schemas: a schema-1 record (tests/fixtures/record_schema1, written by the runner before schema 2) loads
migrated, verifies over its stored bytes, diffs against a later record; replay pins the recorded decisions (field by
field for schema 2, whole for schema 3)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runner.cli.main import main as runner_main
from runner.record import records, schema
from runner.record.replay import pinned_decisions, spec_from_record
from runner.spec import load_spec

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "record_schema1"
OLD = FIXTURE / "record.json"


def test_the_fixture_is_a_schema1_record_as_stored():
    stored = json.loads(OLD.read_text())
    assert stored["schema"] == "sft-tui.record/1" and "decisions" not in stored
    assert records.load_stored(OLD) == stored


def test_schema1_loads_migrated_and_carries_the_decisions_it_states():
    rec = records.load(OLD)
    assert rec["schema"] == schema.SCHEMA == "sft-tui.record/3" and rec["migrated_from"] == "sft-tui.record/1"
    # Schema 1 states only whether FSDP2 wrapped the model (rank 0's end event, in metrics.per_rank).
    assert rec["decisions"] == {"fsdp_sharded": True}
    assert rec["metrics"] == json.loads(OLD.read_text())["metrics"]  # nothing else changes
    assert records.list_records(FIXTURE)[0]["schema"] == schema.SCHEMA


def test_migrations_run_one_version_at_a_time(monkeypatch):
    seen = []

    def three_to_four(rec):
        seen.append(rec["schema"])
        return {**rec, "schema": "sft-tui.record/4", "four": True}

    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, three_to_four])
    monkeypatch.setattr(schema, "VERSION", 4)
    rec = schema.migrate(json.loads(OLD.read_text()))
    assert seen == ["sft-tui.record/3"] and rec["four"] and rec["decisions"] == {"fsdp_sharded": True}
    assert rec["migrated_from"] == "sft-tui.record/1"


@pytest.mark.parametrize("value,message", [("sft-tui.record/4", "written by a newer sft-tui: upgrade it"),
                                           ("sft-tui.record/0", "unknown record schema"),
                                           ("other/1", "this runner reads sft-tui.record/1 to sft-tui.record/3")])
def test_unknown_schemas_are_refused_in_one_line(tmp_path, value, message):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**json.loads(OLD.read_text()), "schema": value}))
    with pytest.raises(records.RecordError, match=message) as e:
        records.load(path)
    assert "\n" not in str(e.value)


def test_a_record_that_does_not_migrate_is_refused_in_one_line(tmp_path, capsys):
    rec = json.loads(OLD.read_text())
    rec["metrics"]["per_rank"] = ["not", "a", "map"]
    path = tmp_path / "odd.json"
    records.save(path, rec)  # locked as it is: only the migration can find it wrong
    with pytest.raises(records.RecordError, match="does not migrate to sft-tui.record/3"):
        records.load(path)
    assert runner_main(["verify", str(path)]) != 0
    err = capsys.readouterr().err
    assert "does not migrate" in err and len(err.strip().splitlines()) == 1


def test_verify_checks_the_stored_lock_then_migrates(tmp_path, capsys):
    assert runner_main(["verify", str(OLD)]) == 0
    out = capsys.readouterr().out
    assert "ok (succeeded" in out and "schema sft-tui.record/1, read as sft-tui.record/3" in out
    # Negative control: one changed byte of the stored content breaks the lock, migrated or not.
    text = OLD.read_text()
    i = text.index('"final_loss": ') + len('"final_loss": ') + 2
    bad = tmp_path / "bad.json"
    bad.write_text(text[:i] + ("1" if text[i] != "1" else "2") + text[i + 1:])
    assert runner_main(["verify", str(bad)]) != 0
    assert "lock mismatch" in capsys.readouterr().err


def test_a_migrated_record_saved_again_is_current_and_locked(tmp_path):
    path = tmp_path / "again.json"
    written = records.save(path, records.load(OLD))  # what a resumed run does with its record
    assert written["schema"] == schema.SCHEMA and "migrated_from" not in written
    assert records.verify(path)[0] and records.load(path)["decisions"] == {"fsdp_sharded": True}


def _new_record(tmp_path: Path, decisions: dict) -> Path:
    """A record of the same run, in today's schema, with the given decisions."""
    rec = records.load(OLD)
    rec.update(id="new-record", decisions=decisions)
    path = tmp_path / "new-record.json"
    records.save(path, rec)
    return path


def test_diff_of_a_schema1_and_a_later_record(tmp_path, capsys):
    shutil.copy(OLD, tmp_path / f"{records.load(OLD)['id']}.json")
    _new_record(tmp_path, {"attn": "sdpa", "loss_impl": "chunked", "fsdp_sharded": True})
    assert runner_main(["diff", records.load(OLD)["id"], "new-record", "--records-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "decisions.attn" in out and "sdpa" in out and "decisions.loss_impl" in out
    assert "decisions.fsdp_sharded" not in out  # the one decision schema 1 states is the same


def test_replay_pins_a_decision_todays_rule_would_change(tmp_path):
    """The fixture's run chose sdpa and the chunked loss (its rank 0's train_begin event), as today's rules do for
    `auto` on CPU. A record that says eager and the full loss replays with them, its spec still saying auto."""
    begin = next(json.loads(x) for x in (FIXTURE / "rank0.jsonl").read_text().splitlines()
                 if '"train_begin"' in x)
    assert (begin["attn"], begin["loss_impl"]) == ("sdpa", "chunked")
    path = _new_record(tmp_path, {"attn": "eager", "loss_impl": "full", "fsdp_sharded": True,
                                  "optimizer_precision": "fp32_master", "attn_kernel": None})
    rec = records.load(path)
    assert (rec["spec"]["model"]["attn_implementation"], rec["spec"]["train"]["loss_impl"]) == ("auto", "auto")
    spec = spec_from_record(rec)
    assert (spec.model.attn_implementation, spec.train.loss_impl) == ("eager", "full")
    assert spec.train.fsdp_one_rank is False  # two ranks: always wrapped, the spec's field is left as it was
    # An old record holds no such decision: today's rule decides (auto stays auto).
    old = spec_from_record(records.load(OLD))
    assert (old.model.attn_implementation, old.train.loss_impl) == ("auto", "auto")


def test_values_a_spec_field_does_not_take_are_not_pinned():
    rec = {"id": "r", "spec": load_spec("tiny-cpu", ["engine=trl"]).to_dict(), "launch": {"world_size": 1},
           "decisions": {"loss_impl": "trl fused lm head", "attn": "sdpa", "fsdp_sharded": False}}
    assert pinned_decisions(rec) == {"model.attn_implementation": "sdpa", "train.fsdp_one_rank": False}


def test_a_schema2_record_migrates_and_its_reported_decisions_are_pinned_field_by_field():
    from runner.record.replay import recorded_decisions

    rec = {**json.loads(OLD.read_text()), "schema": "sft-tui.record/2",
           "decisions": {"attn": "eager", "loss_impl": "full", "fsdp_sharded": True}}
    migrated = schema.migrate(rec)
    assert migrated["schema"] == "sft-tui.record/3" and migrated["decisions"] == rec["decisions"]
    assert recorded_decisions(migrated) is None  # not whole: the replay decides the rest by today's rules
    assert pinned_decisions(migrated) == {"model.attn_implementation": "eager", "train.loss_impl": "full"}


def test_a_schema3_record_gives_its_replay_the_whole_decisions(tmp_path):
    from runner.decide import decide_run
    from runner.plan.autotune import resolve_levers
    from runner.record.replay import recorded_decisions

    decided = decide_run(resolve_levers(load_spec("tiny-cpu", [])))
    path = _new_record(tmp_path, decided.to_dict())
    assert records.verify(path)[0]
    assert recorded_decisions(records.load(path)) == decided
