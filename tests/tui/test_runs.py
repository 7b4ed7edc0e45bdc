"""Real 2-rank CPU runs driven through the app: wizard → launch → dashboard → record, cancel, a killed rank,
and the records browser's diff and replay."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
from textual.widgets import DataTable

from runner.record.records import load, verify
from tests.tui.conftest import ready, run_async, wait_for
from tests.tui.helpers import screen_text, table_rows, text_of
from tui import format as fmt
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen
from tui.screens.modals import ConfirmScreen, QuitDuringRunScreen
from tui.screens.records import DiffScreen, RecordsScreen
from tui.screens.summary import SummaryScreen
from tui.screens.wizard import STEP_IDS, WizardScreen
from tui.specform import load_recipe_dict

pytestmark = pytest.mark.dist

START_S = 60  # torchrun + imports take ~15 s here; generous for a loaded CI machine
RUN_S = 90


def _dashboard(app) -> DashboardScreen | None:
    return next((s for s in app.screen_stack if isinstance(s, DashboardScreen)), None)


def _rank_steps(dash: DashboardScreen) -> dict[int, int]:
    """Steps as the rank table shows them (what a person reads), by rank."""
    table = dash.query_one("#ranks", DataTable)
    return {int(row[0]): int(row[2]) for row in table_rows(table)}


def test_walk_wizard_launch_watch_and_record(tmp_path: Path) -> None:
    """Every wizard step on the embedded default, max_steps typed in, a real run, a live dashboard, the record."""

    async def go() -> None:
        app = make_app(tmp_path / "runs", tmp_path / "records", None, "wizard")
        async with app.run_test(size=(120, 40)) as pilot:
            wiz = await ready(pilot)
            assert isinstance(wiz, WizardScreen) and wiz.step == "model"
            await wait_for(pilot, lambda: "qwen3" in text_of(wiz.query_one("#arch")), 20, "the architecture")
            await pilot.press("ctrl+n")
            assert wiz.step == "dataset"
            await wait_for(pilot, lambda: "packing" in text_of(wiz.query_one("#data-packing")), 60,
                           "the dataset preview")
            assert "✓ chat messages" in text_of(wiz.query_one("#data-detect"))
            await pilot.press("ctrl+n", "ctrl+n")
            assert wiz.step == "method"
            max_steps = wiz.query_one("#f-train-max-steps Input")
            max_steps.focus()
            await pilot.press("end", *["backspace"] * 5, "8")
            await wait_for(pilot, lambda: wiz.data["train"]["max_steps"] == 8, 10, "max_steps=8 typed in")
            await pilot.press("ctrl+n")
            assert wiz.step == "plan"
            await wait_for(pilot, lambda: wiz.plan is not None, 60, "the plan")
            assert "--nproc-per-node=2" in text_of(wiz.query_one("#plan-commands"))
            await pilot.press("ctrl+n")
            assert wiz.step == STEP_IDS[-1]
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), START_S, "the dashboard")
            dash = app.screen
            await wait_for(pilot, lambda: _rank_steps(dash) and max(_rank_steps(dash).values()) >= 1, START_S,
                           "a rank row at step ≥ 1")
            await wait_for(pilot, lambda: isinstance(app.screen, SummaryScreen), RUN_S, "the summary")
            summary = app.screen
            record_path = dash.active.record_path
            assert _rank_steps(dash) == {0: 8, 1: 8}
            assert dash.query_one("#chart").series.keys() == {0, 1}
            assert len(dash.query_one("#chart").series[0]) == 8
            shown = screen_text(summary)
            assert "SUCCEEDED" in shown and re.search(rf"record\s+{re.escape(fmt.show_path(record_path))}\n", shown)

    run_async(go())
    recs = list((tmp_path / "records").glob("*.json"))
    assert len(recs) == 1
    rec = load(recs[0])
    assert rec["status"] == "succeeded" and rec["metrics"]["steps"] == 8
    assert rec["spec"]["train"]["max_steps"] == 8
    assert verify(recs[0])[0]


def _tree(pid: int) -> list[int]:
    try:
        return [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return [pid]


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _long_run_app(tmp_path: Path):
    data = load_recipe_dict("tiny-cpu", ["train.max_steps=400", "train.warmup_steps=0"])
    return make_app(tmp_path / "runs", tmp_path / "records", data, "launch")


async def _launch_until_step(pilot, app, step: int):
    """Launch from the Launch step and return the dashboard once both ranks reached `step`."""
    await ready(pilot)
    await pilot.press("ctrl+l")
    await wait_for(pilot, lambda: _dashboard(app) is not None, START_S, "the dashboard")
    dash = _dashboard(app)
    await wait_for(pilot, lambda: _rank_steps(dash) and min(_rank_steps(dash).values()) >= step, START_S,
                   f"both ranks at step ≥ {step}")
    return dash


def test_cancel_with_confirmation_leaves_no_process(tmp_path: Path) -> None:
    async def go() -> None:
        app = _long_run_app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            dash = await _launch_until_step(pilot, app, 2)
            pids = _tree(dash.active.pid)
            assert len(pids) >= 3  # torchrun and its two ranks
            await pilot.press("c")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
            assert "Cancel run" in screen_text(app.screen)  # the confirmation, not yet cancelled
            assert dash.active.poll() is None
            await pilot.press("y")
            t_cancel = time.monotonic()
            await wait_for(pilot, lambda: isinstance(app.screen, SummaryScreen), RUN_S, "the summary")
            print(f"cancel to summary: {time.monotonic() - t_cancel:.1f} s")
            assert "CANCELLED" in screen_text(app.screen)
            assert _alive(pids) == []
            rec = load(dash.active.record_path)
            assert rec["status"] == "cancelled"
            assert 2 <= rec["metrics"]["steps"] < 400
            # Whether and how it resumes, in the CLI's words (no checkpoint here: train.checkpoint_every is 0).
            from runner.record.compare import resume_sentence

            assert rec["cancel"]["resumable"] is False
            assert "resume: " + resume_sentence(rec) == text_of(app.screen.query_one("#summary-resume"))

    run_async(go())


def test_quit_during_a_run_cancels_it_first(tmp_path: Path) -> None:
    state: dict = {}

    async def go() -> None:
        app = _long_run_app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            dash = await _launch_until_step(pilot, app, 1)
            state["pids"] = _tree(dash.active.pid)
            state["record"] = dash.active.record_path
            await pilot.press("ctrl+q")
            await wait_for(pilot, lambda: isinstance(app.screen, QuitDuringRunScreen), 10, "the question")
            assert "leave it running" in screen_text(app.screen) and "cancel it and quit?" in screen_text(app.screen)
            await pilot.press("c")
            await wait_for(pilot, lambda: not app.is_running, RUN_S, "the app to exit")

    run_async(go())
    assert _alive(state["pids"]) == []
    assert load(state["record"])["status"] == "cancelled"


def test_quit_during_a_run_can_leave_it_running(tmp_path: Path) -> None:
    from runner.launch.supervised import attach

    state: dict = {}

    async def go() -> None:
        app = _long_run_app(tmp_path)
        exit_app = app.exit
        app.exit = lambda *a, **kw: (state.setdefault("message", kw.get("message")), exit_app(*a, **kw))
        async with app.run_test(size=(120, 40)) as pilot:
            dash = await _launch_until_step(pilot, app, 1)
            state["pids"], state["run_id"] = _tree(dash.active.pid), dash.run_id
            await pilot.press("ctrl+q")
            await wait_for(pilot, lambda: isinstance(app.screen, QuitDuringRunScreen), 10, "the question")
            await pilot.press("escape")  # stay: nothing changes
            await wait_for(pilot, lambda: app.screen is dash, 10, "the dashboard again")
            await pilot.press("ctrl+q")
            await wait_for(pilot, lambda: isinstance(app.screen, QuitDuringRunScreen), 10, "the question")
            await pilot.press("l")
            await wait_for(pilot, lambda: not app.is_running, 10, "the app to exit")

    run_async(go())
    assert f"runner attach {state['run_id']}" in state["message"]
    assert len(_alive(state["pids"])) >= 4  # supervisor, torchrun, two ranks: the run goes on
    run = attach(state["run_id"], tmp_path / "runs")
    run.cancel(by="test")
    run.wait()
    deadline = time.monotonic() + 30
    while _alive(state["pids"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(state["pids"]) == [] and load(run.record_path)["status"] == "cancelled"


def test_killed_rank_is_named_on_the_dashboard(tmp_path: Path) -> None:
    async def go() -> None:
        app = _long_run_app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            dash = await _launch_until_step(pilot, app, 2)
            events = dash.run_dir / "events" / "rank1.jsonl"
            start = next(json.loads(line) for line in events.read_text().splitlines()
                         if json.loads(line).get("event") == "start")
            os.kill(start["pid"], signal.SIGKILL)
            await wait_for(pilot, lambda: dash.record is not None, RUN_S, "the run to end")
            banner = text_of(dash.query_one("#banner"))
            assert "rank 1 failed" in banner and "SIGKILL" in banner, banner
            assert "failed" in text_of(dash.query_one("#run-line"))
            await wait_for(pilot, lambda: isinstance(app.screen, SummaryScreen), 10, "the summary")
            shown = screen_text(app.screen)
            assert "FAILED" in shown and "rank 1 failed at step" in shown and "rank1.log" in shown
            rec = load(dash.active.record_path)
            assert rec["status"] == "failed" and rec["failure"]["rank"] == 1
            assert _alive(_tree(dash.active.pid)) == []

    run_async(go())


@pytest.fixture(scope="module")
def one_record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 3-step run written headless (the same code path as `runner run`)."""
    from runner.cli.session import run_headless
    from runner.spec import load_spec, resolve

    base = tmp_path_factory.mktemp("browser")
    spec = resolve(load_spec("tiny-cpu", ["train.max_steps=3"]), cuda_available=False, gpu_count=0)
    assert run_headless(spec, base / "runs", base / "records", plain=True) == 0
    return base


def test_browser_replays_a_record_then_diffs_it_with_the_replay(one_record: Path) -> None:
    base = one_record
    original = load(next((base / "records").glob("*.json")))

    async def go() -> None:
        app = make_app(base / "runs", base / "records", None, "records")
        async with app.run_test(size=(120, 40)) as pilot:
            browser = app.screen
            assert isinstance(browser, RecordsScreen)
            assert [r[1] for r in table_rows(browser.query_one("#records"))] == [original["id"]]
            await pilot.press("p")
            await wait_for(pilot, lambda: "Replay " + original["id"] in screen_text(app.screen), 60,
                           "the replay confirmation")
            await pilot.press("y")
            await wait_for(pilot, lambda: isinstance(app.screen, SummaryScreen), START_S + RUN_S, "the summary")
            summary = app.screen
            shown = screen_text(summary)
            assert "REPRODUCED" in shown and "NOT REPRODUCED" not in shown and "max |Δloss| = 0" in shown
            assert summary.replay["reproduced"] and summary.replay["max_abs_loss_diff"] == 0.0
            await pilot.press("ctrl+r")
            browser = app.screen
            assert isinstance(browser, RecordsScreen)
            ids = [r[1] for r in table_rows(browser.query_one("#records"))]
            assert len(ids) == 2 and ids[1] == original["id"]  # newest first
            await pilot.press("space", "down", "space", "d")
            diff = app.screen
            assert isinstance(diff, DiffScreen)
            rows = {r[0]: r[1:] for r in table_rows(diff.query_one("#diff"))}
            assert rows["replay_of"] == [original["id"], "-"]  # A = the replay (marked first), B = the original
            assert "spec.train.max_steps" not in rows  # same spec
            await pilot.press("escape")
            assert app.screen is browser

    run_async(go())
    recs = sorted((base / "records").glob("*.json"))
    replay = [load(p) for p in recs if load(p).get("replay_of")]
    assert len(replay) == 1 and replay[0]["status"] == "succeeded"
    assert replay[0]["metrics"]["loss_curve"] == original["metrics"]["loss_curve"]
