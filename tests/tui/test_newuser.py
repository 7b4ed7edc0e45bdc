"""The wizard as a new user meets it: Launch that means it, keys that go where expected, one memory figure, the
records browser, a hub that cannot be reached, saving a changed recipe."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from textual.widgets import Button, DataTable, Input

from tests.tui.conftest import (CLOCK_T, DASH_ID, RUN_ID_B, fake_estimate, fixed_backends, ready, record_notices,
                                run_async, settle, synthetic_record, wait_for)
from tests.tui.helpers import fill, table_rows, terminal_text, text_of
from tui import format as fmt
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen
from tui.screens.modals import ConfirmScreen, PathPrompt, SaveRecipePrompt
from tui.screens.records import RecordScreen, RecordsScreen
from tui.screens.summary import SummaryScreen, memory_content
from tui.screens.wizard import WizardScreen
from tui.specform import load_recipe_dict

BAD_ROWS = [{"id": 1, "score": 2.5}, {"id": 2, "score": 1.5}]  # no conversation in any format


def _real_preflight_backends():
    """Fixed estimates and architecture, the real preflight: what `runner run` would find about the same input."""
    return dataclasses.replace(fixed_backends(), preflight_fn=None)


def _app(tmp_path: Path, start: str = "wizard", data=None, **kw):
    return make_app(tmp_path / "runs", tmp_path / "records", data or "tiny-cpu", start,
                    backends=kw.pop("backends", None) or fixed_backends(), **kw)


def test_a_dataset_it_cannot_read_keeps_launch_off(tmp_path: Path) -> None:
    bad = tmp_path / "scores.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in BAD_ROWS))
    data = load_recipe_dict("tiny-cpu", [f"dataset.path={bad}"])

    async def go() -> None:
        app = _app(tmp_path, "dataset", data, backends=_real_preflight_backends())
        async with app.run_test(size=(100, 30)) as pilot:
            wiz = await ready(pilot)
            await wait_for(pilot, lambda: bool(wiz.data_problems), 60, "the dataset's problem")
            detect = text_of(wiz.query_one("#data-detect"))
            # a sentence naming the file's columns, not a library's exception
            assert "✗ " in detect and "id, score" in detect and "Error" not in detect
            bar = text_of(wiz.query_one("#problems"))
            assert bar.startswith("✗ 1 problem") and "spec is valid" not in bar
            assert "✗1" in str(wiz.query_one("#steps").get_option_at_index(1).prompt)
            notices = record_notices(app)
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: any(t == "Cannot launch" for t, _ in notices), 10, "launch refused")
            await settle(pilot)
            assert isinstance(app.screen, WizardScreen)  # no "Launch anyway": nothing to force
            wiz.go("launch")
            await wait_for(pilot, lambda: wiz.plan_complete, 60, "the plan and preflight")
            assert wiz.query_one("#launch", Button).disabled
            assert "problem(s) to fix before launch" in text_of(wiz.query_one("#launch-summary"))
            assert not (tmp_path / "runs").exists()

    run_async(go())


def test_launch_pressed_while_checking_waits_for_preflight_then_refuses(tmp_path: Path) -> None:
    from runner.errors import Problem

    found = [Problem("dataset.path", "row 3 has no assistant turn", "fix the row")]
    backends = dataclasses.replace(fixed_backends(), preflight_fn=lambda spec: found)

    async def go() -> None:
        app = _app(tmp_path, "model", backends=backends)
        async with app.run_test(size=(100, 30)) as pilot:
            wiz = await ready(pilot)
            notices = record_notices(app)
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: wiz.plan_complete, 30, "preflight")
            # the queued launch is decided once preflight is in: refused, with the problem named
            await wait_for(pilot, lambda: any(t == "Cannot launch" for t, _ in notices), 10, "launch refused")
            await settle(pilot)
            assert isinstance(app.screen, WizardScreen) and not wiz.launching and not wiz.launch_queued
            assert wiz.blockers() == found and wiz.query_one("#launch", Button).disabled

    run_async(go())


def test_only_a_not_fit_verdict_offers_to_force(tmp_path: Path) -> None:
    from runner.errors import PredictedNotToFit, SpecError, UserError

    assert issubclass(PredictedNotToFit, UserError) and not issubclass(SpecError, PredictedNotToFit)
    from tui.app import LaunchFailed

    async def go() -> None:
        app = _app(tmp_path, "launch")
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            notices = record_notices(app)
            app.post_message(LaunchFailed("preflight found problems"))
            await wait_for(pilot, lambda: ("Not launched", "preflight found problems") in notices, 10, "the notice")
            assert not isinstance(app.screen, ConfirmScreen)
            app.post_message(LaunchFailed("predicted not to fit", spec=object()))  # type: ignore[arg-type]
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the Launch anyway question")

    run_async(go())


def test_focus_and_help_follow_the_step(tmp_path: Path) -> None:
    async def go() -> None:
        app = _app(tmp_path, "wizard")
        async with app.run_test(size=(100, 30)) as pilot:
            wiz = await ready(pilot)
            await wait_for(pilot, lambda: app.focused is wiz.query_one("#f-model-id Input"), 10, "model.id focused")
            await pilot.press("ctrl+n")
            await wait_for(pilot, lambda: app.focused is wiz.query_one("#f-dataset-id Input"), 10,
                           "dataset.id focused")
            assert wiz.step == "dataset"
            await wait_for(pilot, lambda: text_of(wiz.query_one("#help")).startswith("dataset.id "), 10,
                           "dataset.id's meaning")
            await pilot.press("tab")
            await wait_for(pilot, lambda: text_of(wiz.query_one("#help")).startswith("dataset.path "), 10,
                           "dataset.path's meaning")
            await pilot.press("ctrl+n", "ctrl+n", "ctrl+n")
            await wait_for(pilot, lambda: app.focused is wiz.query_one("#pane-plan"), 10, "the plan pane focused")
            assert wiz.step == "plan"
            assert "scroll the plan" in text_of(wiz.query_one("#help"))

    run_async(go())


def test_end_on_the_step_list_scrolls_the_plan_and_stays_on_it(tmp_path: Path, fixed_python: None) -> None:
    async def go() -> None:
        app = _app(tmp_path, "plan")
        async with app.run_test(size=(80, 24)) as pilot:
            wiz = await ready(pilot)
            await wait_for(pilot, lambda: wiz.plan_complete and wiz.sweep is not None, 30, "the plan")
            pane = wiz.query_one("#pane-plan")
            wiz.query_one("#steps").focus()
            for key, at_end in (("end", True), ("pagedown", True), ("home", False), ("pageup", False)):
                await pilot.press(key)
                # the key is decided once the pane has scrolled where it sends it
                await wait_for(pilot, lambda: pane.scroll_y == (pane.max_scroll_y if at_end else 0), 10, key)
                assert wiz.step == "plan", key
            await pilot.press("end")
            await wait_for(pilot, lambda: pane.scroll_y == pane.max_scroll_y, 10, "the plan's end")
            assert pane.max_scroll_y > 0
            assert "runner.train --spec" in terminal_text(app)  # the torchrun command's end is on screen
            pane.focus()
            await pilot.press("home")
            await wait_for(pilot, lambda: pane.scroll_y == 0, 10, "the plan's top")
            await pilot.press("down")  # arrows on the list still walk the steps
            wiz.query_one("#steps").focus()
            await pilot.press("down")
            await wait_for(pilot, lambda: wiz.step == "launch", 10, "the Launch step")

    run_async(go())


def test_ctrl_q_quits_after_escape_on_the_load_dialog(tmp_path: Path) -> None:
    async def go() -> None:
        app = _app(tmp_path, "launch")
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, PathPrompt), 10, "the load dialog")
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, WizardScreen), 10, "the wizard again")
            await pilot.press("ctrl+q")
            await wait_for(pilot, lambda: not app.is_running, 10, "the app to quit")

    run_async(go())


def test_title_names_the_recipe_and_save_proposes_a_new_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()

    async def go() -> None:
        app = _app(tmp_path, "model")
        async with app.run_test(size=(100, 30)) as pilot:
            wiz = await ready(pilot)
            assert wiz.sub_title == "recipe tiny-cpu"
            fill(wiz, "model.id", "org/My-Model-7B")
            await wait_for(pilot, lambda: wiz.data["model"]["id"] == "org/My-Model-7B", 10, "the typed model id")
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, SaveRecipePrompt), 10, "the save dialog")
            prompt = app.screen
            assert prompt.query_one("#save-name", Input).value == "my-model-7b-full-tiny-chat"
            assert prompt.query_one("#save-description", Input).value == \
                "full fine-tune of org/My-Model-7B on sft-tui/tiny-chat"
            assert prompt.query_one("#save-path", Input).value == "recipes/my-model-7b-full-tiny-chat.yaml"
            await pilot.press("enter")
            await wait_for(pilot, lambda: (tmp_path / "recipes" / "my-model-7b-full-tiny-chat.yaml").is_file(), 10,
                           "the recipe saved")
            saved = (tmp_path / "recipes" / "my-model-7b-full-tiny-chat.yaml").read_text()
            assert "name: my-model-7b-full-tiny-chat" in saved and "org/My-Model-7B" in saved
            assert wiz.data["name"] == "my-model-7b-full-tiny-chat"

    run_async(go())


def test_one_memory_figure_with_one_label_everywhere(tmp_path: Path, synth: Path) -> None:
    from runner.spec import load_spec

    est = fake_estimate(load_spec("tiny-cpu"))
    label = fmt.memory_estimate(est)
    assert label == "21.95 GiB needed per rank"
    rec = synthetic_record("r1")
    rec["estimate"] = {**est, "device": "cpu"}
    summary = memory_content(rec).plain
    assert f"estimate            {label}" in summary or f"{label} (approximate)" in summary
    # A CPU rank measures its resident memory: compared with what the rank needs, not with allocated tensors.
    assert "resident (RSS)" in summary and "needed vs resident" in summary and "allocated" not in summary
    gpu = synthetic_record("r2")
    gpu["spec"]["hardware"]["device"] = "cuda"
    gpu["estimate"] = {"per_gpu_gib": 44.8, "per_gpu_allocated_gib": 40.0, "gpu": "H200", "device": "cuda"}
    text = memory_content(gpu).plain
    assert "44.80 GiB needed per GPU" in text and "40.00 GiB (PyTorch's peak allocated)" in text
    assert "allocated per GPU" in text and "peak allocated, estimated vs measured" in text
    # the CPU legend has no CUDA context or NCCL part
    assert "cuda_context_nccl" not in fmt.breakdown_parts({**est, "device": "cpu"})

    async def go() -> None:
        app = make_app("runs", "records", "tiny-cpu", "dashboard", run_dir=Path("runs") / DASH_ID,
                       backends=fixed_backends(), clock=lambda: CLOCK_T, poll_s=60.0)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and
                           "estimate" in text_of(app.screen.query_one("#gpus")), 10, "the dashboard's GPU panel")
            assert "estimate 44.80 GiB needed per GPU" in text_of(app.screen.query_one("#gpus"))
        wiz = _app(tmp_path, "plan")
        async with wiz.run_test(size=(100, 30)) as pilot:
            screen = await ready(pilot)
            await wait_for(pilot, lambda: screen.plan is not None, 30, "the plan")
            assert label in text_of(screen.query_one("#plan-verdict"))
            assert "cuda_context_nccl" not in screen.query_one("#plan-bar").render().plain

    run_async(go())


def test_records_browser_shows_steps_and_dataset_at_80_columns(synth: Path) -> None:
    async def go() -> None:
        app = make_app("runs", "records", "tiny-cpu", "records", backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, RecordsScreen) and
                           app.screen.query_one("#records", DataTable).row_count == 3, 10, "the three records")
            shown = terminal_text(app)
            table = app.screen.query_one("#records", DataTable)
            rows = table_rows(table)
            assert [c.label.plain for c in table.columns.values()][:6] == [" ", "id", "status", "steps",
                                                                           "final loss", "dataset"]
            assert rows[1][1] == RUN_ID_B and rows[1][3] == "40" and rows[1][5] == "sft-tui/tiny-chat"
            assert RUN_ID_B in shown and " 40 " in shown  # whole ids and step counts without scrolling
            assert "←/→: more columns" in shown

    run_async(go())


def test_a_finished_run_without_steps_does_not_say_waiting(synth: Path) -> None:
    run_dir = Path("runs") / DASH_ID
    for f in (run_dir / "events").glob("rank*.jsonl"):
        f.write_text(json.dumps({"t": 1.0, "rank": 0, "event": "error", "cause": "oom", "message": "x"}) + "\n")

    async def go() -> None:
        app = make_app("runs", "records", "tiny-cpu", "dashboard", run_dir=run_dir, backends=fixed_backends(),
                       clock=lambda: CLOCK_T, poll_s=60.0)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), 10, "the dashboard")
            dash = app.screen
            dash.record = synthetic_record(DASH_ID, status="failed")
            dash.refresh_view(True)
            chart = dash.query_one("#chart")
            await wait_for(pilot, lambda: "ended before its first step" in chart.render().plain, 10,
                           "the chart's sentence")
            assert "waiting" not in chart.render().plain and "ended before its first step" in chart.render().plain

    run_async(go())


def test_an_unreachable_hub_model_is_reported_in_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import runner.gate.hub

    monkeypatch.setattr(runner.gate.hub, "hub_reachable", lambda: False)
    monkeypatch.setattr(runner.gate.hub, "_cache_dir", lambda: tmp_path / "empty-cache")
    data = load_recipe_dict("tiny-cpu", ["model.path=null", "model.id=org/not-cached"])

    async def go() -> None:
        app = _app(tmp_path, "dataset", data, backends=_real_preflight_backends())
        async with app.run_test(size=(100, 30)) as pilot:
            wiz = await ready(pilot)
            await wait_for(pilot, lambda: bool(wiz.data_problems), 5, "the unreachable model")
            assert "org/not-cached is not in the local cache and the hub" in text_of(wiz.query_one("#data-detect"))
            assert text_of(wiz.query_one("#data-preview")) == ""  # nothing left from the previous tokenizer
            wiz.go("plan")
            await wait_for(pilot, lambda: wiz.plan_complete, 30, "preflight")
            assert "✗ preflight found" in text_of(wiz.query_one("#plan-preflight"))

    run_async(go())


def test_replay_dashboard_title_keeps_the_run_id(synth: Path) -> None:
    original = synthetic_record("20260101-000000-demo-0a1b2c")

    async def go() -> None:
        app = make_app("runs", "records", "tiny-cpu", "records", backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, RecordsScreen), 10, "the records list")
            await app.push_screen(DashboardScreen(Path("runs") / DASH_ID, original=original, clock=lambda: CLOCK_T,
                                                  poll_s=60.0))
            await wait_for(pilot, lambda: "replay of" in terminal_text(app), 10, "the replay's dashboard")
            shown = terminal_text(app)
            assert DASH_ID in shown.splitlines()[0]
            assert f"replay of {original['id']}" in shown

    run_async(go())


def test_summary_and_record_open_at_80_columns(synth: Path) -> None:
    async def go() -> None:
        app = make_app("runs", "records", "tiny-cpu", "summary", record_path=Path("records") / f"{RUN_ID_B}.json",
                       backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, SummaryScreen) and RUN_ID_B in terminal_text(app),
                           10, "the summary naming the run")
            app.push_screen(RecordScreen(app.screen.record, Path("records") / f"{RUN_ID_B}.json"))
            await wait_for(pilot, lambda: isinstance(app.screen, RecordScreen) and RUN_ID_B in terminal_text(app),
                           10, "the record naming the run")
            assert not isinstance(app.screen, RecordsScreen)

    run_async(go())


def test_the_longest_field_meaning_is_whole_at_80_columns(tmp_path: Path) -> None:
    async def go() -> None:
        app = _app(tmp_path, "method")
        async with app.run_test(size=(80, 24)) as pilot:
            wiz = await ready(pilot)
            wiz.query_one("#f-train-offload-activations Select").focus()
            help_w = wiz.query_one("#help")
            await wait_for(pilot, lambda: text_of(help_w).startswith("train.offload_activations"), 10,
                           "the field's meaning")
            doc = text_of(help_w)
            assert doc.startswith("train.offload_activations (default 'auto')") and doc.endswith("in forward.")
            assert help_w.size.height * (help_w.size.width - 2) >= len(doc)  # the region holds all of it

    run_async(go())


def test_plan_warns_when_max_steps_is_shorter_than_warmup(tmp_path: Path) -> None:
    data = load_recipe_dict("tiny-cpu", ["train.max_steps=5", "train.warmup_steps=20"])

    async def go() -> None:
        app = _app(tmp_path, "plan", data)
        async with app.run_test(size=(100, 30)) as pilot:
            wiz = await ready(pilot)
            await wait_for(pilot, lambda: wiz.plan is not None, 30, "the plan")
            assert "warning: train.max_steps=5 is shorter than train.warmup_steps=20" in \
                text_of(wiz.query_one("#plan-verdict"))

    run_async(go())


def test_fixing_the_input_elsewhere_lifts_a_stale_block(tmp_path: Path) -> None:
    from runner.errors import Problem

    calls = []

    def preflight(spec):
        calls.append(spec.train.seq_len)
        return [Problem("train.seq_len", "too short for any target")] if spec.train.seq_len == 8 else []

    backends = dataclasses.replace(fixed_backends(), preflight_fn=preflight)

    async def go() -> None:
        app = _app(tmp_path, "plan", load_recipe_dict("tiny-cpu", ["train.seq_len=8"]), backends=backends)
        async with app.run_test(size=(100, 30)) as pilot:
            wiz = await ready(pilot)
            await wait_for(pilot, lambda: wiz.plan_complete, 30, "preflight")
            assert wiz.blockers() and "✗1" in str(wiz.query_one("#steps").get_option_at_index(3).prompt)
            wiz.go("method")
            fill(wiz, "train.seq_len", "512")
            await wait_for(pilot, lambda: wiz.data["train"]["seq_len"] == 512, 10, "the new seq_len")
            # Checked again on the Plan or at launch, not blocked by the old finding: the edit's handlers clear it
            # (waited for as a condition, not a pause, so a loaded machine cannot turn it into a failure).
            await wait_for(pilot, lambda: wiz.blockers() == [], 10, "the stale block lifted")

    run_async(go())


def test_a_record_that_failed_before_its_first_step_says_so(synth: Path) -> None:
    rec = synthetic_record("20260101-010000-demo-000000", status="failed")
    rec["metrics"]["loss_curve"] = {"0": [], "1": []}

    async def go() -> None:
        app = make_app("runs", "records", "tiny-cpu", "records", backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, RecordsScreen), 10, "the records list")
            await app.push_screen(RecordScreen(rec, Path("records") / "x.json"))
            await wait_for(pilot, lambda: "no step was logged" in app.screen.query_one("#record-chart").render().plain,
                           10, "the record's chart")
            chart = app.screen.query_one("#record-chart")
            assert "no step was logged: the run failed before its first step" in chart.render().plain
            assert "waiting" not in chart.render().plain

    run_async(go())
