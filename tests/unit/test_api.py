"""runner.api, the faces' door: one run-handle protocol for both kinds of run, types loaded on first use, and the gate
a face calls before it launches (that importing the API loads no torch: tests/tui/test_first_screen.py)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from runner import api
from runner.events.paths import RunPaths
from runner.launch.handle import RunHandle
from runner.launch.run import ActiveRun
from runner.launch.supervised import SupervisedRun

# Each protocol method with the arguments a face passes it.
CALLS = {"poll": (), "view": (lambda: 0.0,), "cancel": (), "stop": (), "wait": (), "finish": (0,)}


def protocol_members() -> set[str]:
    return {n for n in vars(RunHandle) if not n.startswith("_")} - {"copy_with"}


def test_the_protocol_names_state_events_cancel_wait_and_result() -> None:
    assert protocol_members() == {"run_id", "spec", "paths", "record_path", "record", "cancelled", "ended", "poll",
                                  "view", "cancel", "stop", "wait", "finish"}
    assert set(CALLS) == {n for n in protocol_members() if inspect.isfunction(vars(RunHandle)[n])}


def members_of(run: type | object) -> set[str]:
    """What a class or an instance offers: its attributes, a dataclass's fields, an instance's own attributes."""
    return set(dir(run)) | set(getattr(run, "__dataclass_fields__", {})) | set(getattr(run, "__dict__", {}))


def test_both_runs_implement_every_member_of_the_handle(tmp_path: Path) -> None:
    # ActiveRun as a class (an instance needs a started torchrun); SupervisedRun as an attached view of a run folder.
    attached = SupervisedRun(RunPaths(tmp_path / "run"))
    for run, cls in ((ActiveRun, ActiveRun), (attached, SupervisedRun)):
        assert protocol_members() <= members_of(run), (cls.__name__, protocol_members() - members_of(run))
        for name, args in CALLS.items():
            # Callable with the arguments a face passes (the extra parameters a class has are optional).
            inspect.signature(getattr(cls, name)).bind(None, *args)
    assert isinstance(attached, RunHandle)
    assert not attached.ended and attached.view().run_dir == tmp_path / "run"


def test_the_api_types_load_on_first_use() -> None:
    from runner.record.records import RecordError

    assert api.RecordError is RecordError and api.RunHandle is RunHandle and api.Gate.__name__ == "Gate"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        api.nothing  # noqa: B018


def test_the_gate_passes_the_embedded_run_with_its_estimate_and_packing_check(tmp_path: Path) -> None:
    spec = api.resolve_for(api.load("tiny-cpu", ["train.max_steps=3"]), 0)[0]
    gate = api.gate(spec, runs_dir=tmp_path)
    assert gate.estimate is not None and gate.estimate["fits"] is True and gate.estimate["steps"] == 3
    # The packing check's verdict is kept in the record with what was predicted, and is a note a face shows.
    assert gate.packing is not None and gate.estimate["packing_check"] == gate.packing.to_dict()
    assert [n.text for n in gate.notes if not n.warning] == [gate.packing.describe()]
