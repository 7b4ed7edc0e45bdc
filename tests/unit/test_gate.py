"""The launch gate's one entry point (runner.gate.check): the checks in order, a frozen result the faces print, and
nothing printed by the gate itself."""

from __future__ import annotations

import dataclasses

import pytest

from runner.errors import PredictedNotToFit, SpecError
from runner.gate import Gate, check
from runner.spec import load_spec


def test_a_run_that_passes_gets_its_estimate_packing_check_and_notes(tmp_path, capsys):
    gate = check(load_spec("tiny-cpu"), force=False, runs_dir=tmp_path)
    assert isinstance(gate, Gate) and gate.estimate is not None and gate.estimate["fits"] is True
    assert gate.packing is not None and gate.packing.status == "exact"
    # The verdict is kept in the record's estimate and said first, as information.
    assert gate.estimate["packing_check"] == gate.packing.to_dict()
    assert [(n.text, n.warning) for n in gate.notes] == [(gate.packing.describe(), False)]
    assert capsys.readouterr() == ("", "")  # the faces print, never the gate
    with pytest.raises(dataclasses.FrozenInstanceError):
        gate.estimate = None  # type: ignore[misc]


def test_a_plan_that_does_not_fit_is_refused_before_preflight_unless_forced(tmp_path, monkeypatch):
    import runner.gate.preflight

    spec = load_spec("tiny-cpu", ["train.seq_len=10000000"])
    monkeypatch.setattr(runner.gate.preflight, "preflight", lambda s: pytest.fail("preflight ran on a refused plan"))
    with pytest.raises(PredictedNotToFit, match="predicted not to fit: .* per rank \\(CPU memory\\)"):
        check(spec, force=False)
    monkeypatch.undo()
    forced = check(load_spec("tiny-cpu", ["train.seq_len=4096", "train.optimizer_precision=bf16",
                                          "train.lr=1e-5"]), force=True)
    warnings = [n.text for n in forced.notes if n.warning]
    assert len(warnings) == 1 and warnings[0].startswith("note: train.optimizer_precision=bf16"), forced.notes


def test_preflight_problems_raise_with_every_problem(tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"text": "no conversation here"}\n')
    with pytest.raises(SpecError) as e:
        check(load_spec("tiny-cpu", [f"dataset.path={bad}", "dataset.format=messages"]), force=True)
    assert e.value.problems and all(p.field for p in e.value.problems)
