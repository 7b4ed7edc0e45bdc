"""A run started elsewhere (`runner run` in another process) outlives its view and is live in every other one:
the first view hangs up (SIGHUP) and detaches (its --json line in the run folder), `runner attach` shows its steps, the app's records browser says it
runs and Enter opens its live dashboard, where `c` asks first (and No keeps it running), and Ctrl+C in
`runner attach` cancels it: every view sees the end."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from runner.record.records import load, verify
from tests.procs import start_runner, wait_for_step
from tests.tui.conftest import run_async, wait_for
from tests.tui.helpers import screen_text, text_of
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen
from tui.screens.records import RecordsScreen
from tui.screens.summary import SummaryScreen

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[2]


def _lines(proc: subprocess.Popen) -> queue.Queue:
    q: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            q.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return q


def test_a_run_started_elsewhere_is_followed_and_cancelled_from_other_views(tmp_path: Path) -> None:
    runs, records = tmp_path / "runs", tmp_path / "records"
    dirs = ["--runs-dir", str(runs), "--records-dir", str(records)]
    first = start_runner(["run", "tiny-cpu", "--set", "train.max_steps=2000", "--set", "train.log_every=1", "--plain",
                          "--json", *dirs])
    run_dir, _ = wait_for_step(runs, 1)
    attach = start_runner(["attach", run_dir.name, "--plain", *dirs])
    lines = _lines(attach)
    seen: list[str] = []
    while not any(line.startswith("step ") for line in seen):
        seen.append(lines.get(timeout=60))
    first.send_signal(signal.SIGHUP)  # the first view's terminal went away: it detaches, the run goes on
    out, err = first.communicate(timeout=30)
    assert first.returncode == 129 and f"runner attach {run_dir.name}" in err, err
    # Its --json line goes to the run folder (a hung-up terminal would lose it), and to stdout where that is a pipe.
    result = json.loads((run_dir / "view-result.json").read_text())
    assert result["id"] == run_dir.name and result["detached"] and result["status"] == "running"
    assert json.loads(out.splitlines()[-1]) == result

    async def go() -> None:
        app = make_app(runs, records, None, "records")
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, RecordsScreen), 20, "the records browser")
            assert "1 running (enter: live dashboard)" in text_of(app.screen.query_one("#records-head"))
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), 20, "the live dashboard")
            dash = app.screen
            seen_step = dash.view.global_step
            await wait_for(pilot, lambda: dash.view.global_step > seen_step, 60, "a new step on the dashboard")
            await pilot.press("c")
            await pilot.pause()
            assert "Cancel run" in screen_text(app.screen)  # it asks first
            await pilot.press("n")
            await wait_for(pilot, lambda: app.screen is dash, 10, "the dashboard again")
            seen_step = dash.view.global_step
            await wait_for(pilot, lambda: dash.view.global_step > seen_step, 60, "the run going on after No")
            attach.send_signal(signal.SIGINT)  # not a terminal: Ctrl+C in `runner attach` cancels without asking
            await wait_for(pilot, lambda: isinstance(app.screen, SummaryScreen), 90, "the summary")
            assert "CANCELLED" in screen_text(app.screen)

    run_async(go())
    attach.wait(timeout=60)
    while not lines.empty():
        seen.append(lines.get())
    assert attach.returncode == 130, "".join(seen)
    text = "".join(seen)
    assert "no checkpoint, so it cannot be resumed" in text and "cancelled:" in text
    record = records / f"{run_dir.name}.json"
    rec = load(record)
    assert rec["status"] == "cancelled" and rec["cancel"]["by"] == "SIGINT to runner attach" and verify(record)[0]
