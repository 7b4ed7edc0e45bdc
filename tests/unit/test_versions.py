"""Supported version ranges (one table: pyproject, preflight, README), and the record's pins naming the copy of a
package that is imported."""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from runner.errors import SpecError
from runner.gate import versioncheck
from runner.gate.preflight import preflight
from runner.record import pins
from runner.record.replay import drift, folds
from runner.spec import load_spec
from runner.versions import SUPPORTED, imported_version, requirement
from tests.conftest import REPO


def test_pyproject_declares_the_supported_ranges():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0]: d for d in deps}
    assert {name: declared.get(name) for name in SUPPORTED} == {name: requirement(name) for name in SUPPORTED}
    oldest = dict(line.split("==") for line in (REPO / ".ci/oldest.txt").read_text().splitlines()
                  if line and not line.startswith("#"))
    # CI's oldest set is the table's lower bounds (torch: the build on disk, the lower bound too).
    assert {n: v for n, v in oldest.items() if n in SUPPORTED} == {
        n: low + ".0" * (3 - low.count(".") - 1) for n, (low, _) in SUPPORTED.items() if n != "torch"}
    readme = (REPO / "README.md").read_text()
    for name, (low, high) in SUPPORTED.items():
        assert f"{name} >={low},<{high}" in readme, name


def test_the_installed_set_is_supported():
    assert versioncheck.version_problems() == []


def test_an_old_trl_is_refused_in_one_line(monkeypatch):
    real = imported_version
    monkeypatch.setattr(versioncheck, "imported_version", lambda n: "1.14.0" if n == "trl" else real(n))
    with pytest.raises(SpecError) as e:
        preflight(load_spec("tiny-gpt-oss-cpu"))
    assert str(e.value) == ("preflight found problems: trl: 1.14.0 is installed; supported: >=1.16,<2 "
                            "(fix: pip install 'trl>=1.16,<2')")


@pytest.mark.parametrize("found, ok", [("2.13.0+cpu", True), ("2.14.0.dev20261201", True), ("3.0.0", False),
                                       ("2.11.0+cu130", True), ("2.10.1", False)])
def test_versions_compare_by_release(monkeypatch, found, ok):
    monkeypatch.setattr(versioncheck, "imported_version", lambda n: found if n == "torch" else imported_version(n))
    assert (versioncheck.version_problems() == []) is ok


def _fake_dist(root: Path, version: str) -> None:
    pkg = root / "sfttuifake"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"VERSION = {version!r}\n")
    info = root / f"sfttuifake-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sfttuifake\nVersion: {version}\n")
    (info / "top_level.txt").write_text("sfttuifake\n")


def test_two_copies_on_the_path_pin_the_one_imported(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    _fake_dist(a, "1.14.0")
    _fake_dist(b, "1.16.0")
    monkeypatch.setattr(sys, "path", [str(a), str(b), *sys.path])
    monkeypatch.delitem(sys.modules, "sfttuifake", raising=False)
    assert pins.packages()["sfttuifake"] == "1.14.0"  # before import: the copy import finds
    import sfttuifake

    assert sfttuifake.VERSION == "1.14.0"
    # The path changes after the import (a .pth, a later sys.path.insert): the module that ran still decides.
    monkeypatch.setattr(sys, "path", [str(b), str(a), *sys.path[2:]])
    assert [d.version for d in metadata.distributions(name="sfttuifake")] == ["1.16.0", "1.14.0"]
    assert pins.packages()["sfttuifake"] == "1.14.0"
    monkeypatch.setenv("PYTHONPATH", f"{b}:{a}")
    assert pins.interpreter_pins() == {"interpreter": sys.executable, "pythonpath": f"{b}:{a}"}
    monkeypatch.delitem(sys.modules, "sfttuifake")


def test_drift_lists_what_changes_the_numbers_first():
    rec = {"python": "3.11.2", "torch": "2.13.0", "packages": {"aaa": "1", "trl": "1.16.0", "zzz": "2",
                                                                 "transformers": "5.24.0"},
           "tokenizer_sha256": "x", "interpreter": "/a/python"}
    cur = {"python": "3.11.2", "torch": "2.13.0", "packages": {"aaa": "2", "trl": "1.14.0", "zzz": "3",
                                                                 "transformers": "5.25.0"},
           "tokenizer_sha256": "y", "interpreter": "/b/python"}
    rows = drift(rec, cur)
    assert [r["pin"] for r in rows] == ["package transformers", "package trl", "tokenizer_sha256", "package aaa",
                                        "package zzz", "interpreter"]
    assert [folds(r) for r in rows] == [False, False, False, True, True, False]
    from rich.console import Console

    from runner.cli.session import print_drift

    console = Console(record=True, width=120)
    print_drift(console, rows)
    text = console.export_text()
    assert "package trl" in text and "2 other package(s)" in text and "package aaa" not in text
    assert text.index("package transformers") < text.index("tokenizer_sha256") < text.index("2 other package(s)")
