"""Engines are data (runner/engines.py): no code outside the registry compares engine names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runner.engines import ENGINES, LEVERS, engine_for
from runner.spec import RunSpec

REPO = Path(__file__).resolve().parents[2]
NAMES = "|".join(ENGINES)
# `spec.engine == "trl"`, `engine != "native"`, `"trl" == engine`, `engine in ("native", ...)`, `combo[0] !=
# "engine=native"`: each asks a name what a record field should say.
COMPARISON = re.compile(rf"""engine\w*\W*\s*(==|!=|\bin\b|\bnot in\b)\s*[("'\[]"""
                        rf"""|["'](engine=)?({NAMES})["']\s*(==|!=)"""
                        rf"""|(==|!=)\s*["'](engine=)?({NAMES})["']"""
                        rf"""|\b(if|and|or)\b[^#]*\bin\s*[(\[{{]\s*["']({NAMES})["']""")


def comparisons(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if COMPARISON.search(line)]


def test_no_engine_name_comparison_outside_the_registry():
    found = []
    for path in sorted([*(REPO / "runner").rglob("*.py"), *(REPO / "tui").rglob("*.py")]):
        if path == REPO / "runner" / "engines.py":
            continue
        found += [f"{path.relative_to(REPO)}: {line}" for line in comparisons(path.read_text())]
    assert not found, "compare Engine fields (runner.engines), not engine names:\n" + "\n".join(found)


@pytest.mark.parametrize("line", ['if spec.engine == "trl":', "if engine != 'native' or x:", 'if "trl" == e:',
                                  'bad = [e for e in engines if e not in ("native", "trl")]',
                                  'if combo[0] != "engine=native":', 'ok = x and engine in ["trl"]'])
def test_the_check_catches_a_comparison(line):
    assert comparisons(line) == [line]


def test_every_engine_the_spec_accepts_has_a_record_and_known_levers():
    import typing

    assert set(typing.get_args(RunSpec.model_fields["engine"].annotation)) == set(ENGINES)
    for engine in ENGINES.values():
        assert engine_for(engine.name) is engine
        assert set(engine.lacks) <= set(LEVERS)
        assert all(any(e.honours(lever) for e in ENGINES.values()) for lever in engine.lacks)
