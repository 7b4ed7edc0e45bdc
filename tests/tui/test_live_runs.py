"""A run started elsewhere (`runner run` in another process) is live in the app: the records browser says so,
Enter opens its live dashboard, and `c` cancels it after asking."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.events.lines import read_events
from runner.record.records import load, verify
from tests.tui.conftest import run_async, wait_for
from tests.tui.helpers import screen_text, text_of
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen
from tui.screens.records import RecordsScreen
from tui.screens.summary import SummaryScreen

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[2]


def _wait_for_step(runs: Path, step: int, timeout_s: float = 120) -> Path:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for run_dir in runs.glob("*"):
            if any(e.get("step", 0) >= step and "event" not in e
                   for e in read_events(run_dir / "events" / "rank0.jsonl")):
                return run_dir
        time.sleep(0.2)
    raise AssertionError(f"rank 0 never reached step {step}")


def test_records_browser_opens_a_running_run_live_and_cancels_it_after_asking(tmp_path: Path) -> None:
    runs, records = tmp_path / "runs", tmp_path / "records"
    proc = subprocess.Popen([sys.executable, "-m", "runner", "run", "tiny-cpu", "--set", "train.max_steps=2000",
                             "--set", "train.log_every=1", "--plain", "--runs-dir", str(runs), "--records-dir",
                             str(records)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = _wait_for_step(runs, 1)

    async def go() -> None:
        app = make_app(runs, records, None, "records")
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, RecordsScreen), 20, "the records browser")
            head = text_of(app.screen.query_one("#records-head"))
            assert "1 running (enter: live dashboard)" in head
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), 20, "the live dashboard")
            dash = app.screen
            seen = dash.view.global_step
            await wait_for(pilot, lambda: dash.view.global_step > seen, 60, "a new step on the dashboard")
            await pilot.press("c")
            await pilot.pause()
            assert "Cancel run" in screen_text(app.screen)
            assert proc.poll() is None  # asked, not yet cancelled
            await pilot.press("y")
            await wait_for(pilot, lambda: isinstance(app.screen, SummaryScreen), 90, "the summary")
            assert "CANCELLED" in screen_text(app.screen)

    run_async(go())
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    record = records / f"{run_dir.name}.json"
    rec = load(record)
    assert rec["status"] == "cancelled" and rec["cancel"]["by"] == "sft-tui" and verify(record)[0]
