"""Engines are data (runner/engines.py): every engine the spec accepts has a record (tests/unit/test_registries.py
checks that no code outside the registry compares engine names)."""

from __future__ import annotations

from runner.engines import ENGINES, LEVERS, engine_for
from runner.spec import RunSpec


def test_every_engine_the_spec_accepts_has_a_record_and_known_levers():
    import typing

    assert set(typing.get_args(RunSpec.model_fields["engine"].annotation)) == set(ENGINES)
    for engine in ENGINES.values():
        assert engine_for(engine.name) is engine
        assert set(engine.lacks) <= set(LEVERS)
        assert all(any(e.honours(lever) for e in ENGINES.values()) for lever in engine.lacks)
