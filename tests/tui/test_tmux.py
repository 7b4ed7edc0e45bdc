"""The real `sft-tui` binary in an 80×24 tmux pane, driven by keys only through a whole tiny-cpu run: every wizard
step, launch, dashboard, summary, records browser, the record (tests/tui/tmux_drive.sh)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

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
