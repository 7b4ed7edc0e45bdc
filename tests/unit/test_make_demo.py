"""`make demo`: the closing hint names the run that was recorded, and says so when none was (the wizard quit)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _demo(tmp_path: Path, records_a_run: bool) -> subprocess.CompletedProcess[str]:
    """`make demo` in a copy of the Makefile, with a stand-in `runner` in the venv (stdout is a pipe: the headless
    branch), so only the Makefile's own logic runs."""
    work = tmp_path / "w"
    (work / ".ci").mkdir(parents=True)
    for f in ("Makefile", "pyproject.toml", ".ci/constraints.txt"):
        shutil.copy(REPO / f, work / f)
    bin_dir = work / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    write = "mkdir -p records && echo '{}' > records/tiny-cpu-20260101-000000-abcd.json" if records_a_run else "true"
    (bin_dir / "runner").write_text(f"#!/bin/sh\n{write}\n")
    (bin_dir / "runner").chmod(0o755)
    (work / ".venv" / ".installed").touch()  # newer than the Makefile's inputs: no setup
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    return subprocess.run(["make", "-s", "demo"], cwd=work, capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.launches
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_demo_hint_names_the_recorded_run(tmp_path: Path) -> None:
    out = _demo(tmp_path, records_a_run=True)
    assert out.returncode == 0, out.stderr
    assert "runner verify tiny-cpu-20260101-000000-abcd" in out.stdout and "<id>" not in out.stdout


@pytest.mark.launches
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_demo_without_a_recorded_run_gives_no_next_step(tmp_path: Path) -> None:
    out = _demo(tmp_path, records_a_run=False)
    assert out.returncode == 0, out.stderr
    assert "next:" not in out.stdout and "no run was recorded" in out.stdout
