"""The real `sft-tui` binary in an 80×24 tmux pane, driven by keys only through a whole tiny-cpu run: every wizard
step, launch, dashboard, summary, records browser, the record (tests/tui/tmux_drive.sh)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

import pytest

from runner.record.records import verify

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("tmux_drive.sh")


@pytest.mark.dist
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_sft_tui_in_tmux_runs_tiny_cpu_to_a_record(tmp_path: Path) -> None:
    binary = Path(sys.executable).with_name("sft-tui")
    if not binary.exists():
        pytest.skip(f"no sft-tui console script next to {sys.executable} (pip install -e .)")
    proc = subprocess.run([str(SCRIPT), str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SFT_TUI": str(binary), "MAX_STEPS": "5"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = Path(proc.stdout.strip().splitlines()[-1].removeprefix("record: "))
    assert record.parent == tmp_path / "records"
    assert "SUCCEEDED" in proc.stdout and f"records/{record.stem}.json" in proc.stdout  # the path was on the screen
    records_screen = proc.stdout.split("--- records")[1].split("--- record\n")[0]
    assert record.stem in records_screen  # the whole id, at 80 columns
    rec = json.loads(record.read_text())
    assert rec["status"] == "succeeded" and rec["metrics"]["steps"] == 5
    assert verify(record)[0]


def _processes_under(folder: Path) -> list[psutil.Process]:
    """The wizard (its working folder) and the run's processes (their spec path) of one test."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if p.pid != os.getpid() and (str(folder) in cmd or (p.info["cwd"] == str(folder) and "sft-tui" in cmd)):
                out.append(p)
        except psutil.Error:
            continue
    return out


@pytest.mark.dist
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_closing_the_terminal_mid_run_leaves_the_run_to_finish_its_record(tmp_path: Path) -> None:
    binary = Path(sys.executable).with_name("sft-tui")
    if not binary.exists():
        pytest.skip(f"no sft-tui console script next to {sys.executable} (pip install -e .)")
    steps = 30
    proc = subprocess.run([str(SCRIPT), str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SFT_TUI": str(binary), "MAX_STEPS": str(steps), "HANGUP": "1"})
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("hung up"), proc.stdout[-3000:] + proc.stderr
    [run_dir] = list((tmp_path / "runs").iterdir())
    record = tmp_path / "records" / f"{run_dir.name}.json"
    deadline = time.time() + 240
    while time.time() < deadline and (not record.exists() or json.loads(record.read_text())["status"] == "running"):
        time.sleep(0.5)
    rec = json.loads(record.read_text())
    assert rec["status"] == "succeeded" and rec["metrics"]["steps"] == steps and verify(record)[0]
    deadline = time.time() + 30
    while _processes_under(tmp_path) and time.time() < deadline:
        time.sleep(0.2)
    assert [p.info["cmdline"] for p in _processes_under(tmp_path)] == []
