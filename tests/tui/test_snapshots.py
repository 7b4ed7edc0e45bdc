"""Pictures of every screen (pytest-textual-snapshot) at the two sizes people use, 100×30 and 80×24: the wizard's
steps (the Plan also scrolled to its end), dashboard (also a replay's), summary, records, record, diff, dialogs.

Deterministic by construction: fixed backends (estimate, sweep, architecture, no GPU), a synthetic run folder and
records with fixed times and ids, a fixed clock for event ages, `python` as the interpreter, relative paths.
Regenerate with `pytest tests/tui/test_snapshots.py --snapshot-update` and look at the report before committing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tui.conftest import CLOCK_T, DASH_ID, REPO, RUN_ID, RUN_ID_B, T0, fixed_backends, wait_for
from tests.tui.conftest import settle as settle_app
from tui.app import make_app

SIZE = (100, 30)
SMALL = (80, 24)
SIZES = pytest.mark.parametrize("size", [SIZE, SMALL], ids=["100x30", "80x24"])


async def settle(pilot) -> None:
    """Wait until the screen is quiet (see conftest.settle), then steady the focused field's cursor: the same picture
    every time."""
    from textual.widgets import Input

    await settle_app(pilot)
    for widget in pilot.app.screen.query(Input):
        widget.cursor_blink = False
    await pilot.pause()


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch, fixed_python: None) -> None:
    """Wizard pictures show the shipped recipe's paths relative to the repository."""
    monkeypatch.chdir(REPO)


def wizard(step: str, **kw):
    return make_app("runs", "records", kw.pop("initial_spec", "tiny-cpu"), step, backends=fixed_backends(), **kw)


@SIZES
@pytest.mark.parametrize("step", ["model", "dataset", "hardware", "plan", "launch"])
def test_wizard_step(snap_compare, in_repo: None, step: str, size: tuple[int, int]) -> None:
    assert snap_compare(wizard(step), terminal_size=size, run_before=settle)


@SIZES
def test_wizard_plan_scrolled_to_its_end(snap_compare, in_repo: None, size: tuple[int, int]) -> None:
    """End on the step list scrolls the Plan to the torchrun command and stays on the Plan."""

    async def to_end(pilot) -> None:
        await settle(pilot)
        pilot.app.screen.query_one("#steps").focus()
        await pilot.press("end")
        pane = pilot.app.screen.query_one("#pane-plan")
        await wait_for(pilot, lambda: pane.scroll_y == pane.max_scroll_y, 10, "the plan's end")  # 0 when it all fits

    assert snap_compare(wizard("plan"), terminal_size=size, run_before=to_end)


@SIZES
def test_wizard_method_lora_with_a_problem(snap_compare, in_repo: None, size: tuple[int, int]) -> None:
    async def edit(pilot) -> None:
        screen = pilot.app.screen
        screen.query_one("#f-method-kind Select").value = "lora"
        screen.query_one("#f-train-seq-len Input").value = "-5"
        await settle(pilot)

    assert snap_compare(wizard("method"), terminal_size=size, run_before=edit)


def test_wizard_plan_does_not_fit(snap_compare, in_repo: None) -> None:
    """An 8 × H100 target that does not fit: red verdict, the bar over capacity, the suggestion, two nodes."""
    from tui.specform import load_recipe_dict

    data = load_recipe_dict("tiny-cpu", ["hardware.device=cuda", "hardware.gpu=H100-80GB", "hardware.nproc_per_node=8",
                                         "hardware.nodes=2", "hardware.rdzv_endpoint=node0:29500",
                                         "train.seq_len=32768"])
    assert snap_compare(wizard("plan", initial_spec=data), terminal_size=SIZE, run_before=settle)


def dashboard(synth: Path, theme: str | None = None):
    app = make_app("runs", "records", "tiny-cpu", "dashboard", run_dir=Path("runs") / DASH_ID,
                   backends=fixed_backends(), clock=lambda: CLOCK_T, poll_s=60.0)
    if theme:
        app.theme = theme
    return app


@SIZES
def test_dashboard(snap_compare, synth: Path, size: tuple[int, int]) -> None:
    assert snap_compare(dashboard(synth), terminal_size=size, run_before=settle)


# The eval losses the embedded default recorded at steps 25-100 with dataset.eval_fraction=0.05 and
# train.eval_every=25 (a real CPU run), put at steps 10-40 of the synthetic run.
EVAL_LOSSES = (3.2706, 1.8159, 1.5170, 1.2266)


@SIZES
def test_dashboard_with_eval_curve(snap_compare, synth: Path, size: tuple[int, int]) -> None:
    """Eval events draw the eval curve over the rank curves, with its own legend entry."""
    for r in (0, 1):
        with open(synth / "runs" / DASH_ID / "events" / f"rank{r}.jsonl", "a") as f:
            for i, loss in enumerate(EVAL_LOSSES):
                step = 10 * (i + 1)
                if step <= 40 - 3 * r:
                    f.write(json.dumps({"t": T0 + 10 + step * 0.5, "rank": r, "event": "eval", "step": step,
                                        "loss": loss, "accuracy": 0.4 + 0.05 * i}) + "\n")
    assert snap_compare(dashboard(synth), terminal_size=size, run_before=settle)


@SIZES
def test_replay_dashboard(snap_compare, synth: Path, size: tuple[int, int]) -> None:
    """A replay: the title keeps the new run's whole id, the banner names the original."""
    from tests.tui.conftest import synthetic_record
    from tui.screens.dashboard import DashboardScreen

    async def replay(pilot) -> None:
        await pilot.app.push_screen(DashboardScreen(Path("runs") / DASH_ID, original=synthetic_record(RUN_ID),
                                                    clock=lambda: CLOCK_T, poll_s=60.0))
        await settle(pilot)

    assert snap_compare(records(synth), terminal_size=size, run_before=replay)


def test_dashboard_smoothed_light_theme(snap_compare, synth: Path) -> None:
    assert snap_compare(dashboard(synth, "textual-light"), press=["s", "r"], terminal_size=SIZE, run_before=settle)


@pytest.mark.parametrize(("record_id", "size"), [(RUN_ID, SIZE), (RUN_ID_B, SIZE), (RUN_ID_B, SMALL)],
                         ids=["succeeded-100x30", "failed-100x30", "failed-80x24"])
def test_summary(snap_compare, synth: Path, record_id: str, size: tuple[int, int]) -> None:
    app = make_app("runs", "records", "tiny-cpu", "summary", record_path=Path("records") / f"{record_id}.json",
                   backends=fixed_backends())
    assert snap_compare(app, terminal_size=size, run_before=settle)


def records(synth: Path):
    return make_app("runs", "records", "tiny-cpu", "records", backends=fixed_backends())


@SIZES
def test_records_list(snap_compare, synth: Path, size: tuple[int, int]) -> None:
    assert snap_compare(records(synth), press=["down", "space"], terminal_size=size, run_before=settle)


@SIZES
def test_record_open(snap_compare, synth: Path, size: tuple[int, int]) -> None:
    assert snap_compare(records(synth), press=["down", "down", "enter"], terminal_size=size, run_before=settle)


@SIZES
def test_records_diff(snap_compare, synth: Path, size: tuple[int, int]) -> None:
    assert snap_compare(records(synth), press=["down", "space", "down", "space", "d"], terminal_size=size,
                        run_before=settle)


def test_load_recipe_prompt(snap_compare, in_repo: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import runner.spec

    monkeypatch.setattr(runner.spec, "recipe_names", lambda: ["qwen3-1.7b-full-h200", "tiny-cpu"])

    async def prompt(pilot) -> None:
        from textual.widgets import Input

        from tui.screens.modals import PathPrompt

        await settle(pilot)
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, PathPrompt), 10, "the load dialog")
        pilot.app.screen.query_one(Input).cursor_blink = False  # a steady cursor: the same picture every time

    assert snap_compare(wizard("launch"), terminal_size=SIZE, run_before=prompt)


def test_save_recipe_prompt(snap_compare, in_repo: None) -> None:
    async def prompt(pilot) -> None:
        from textual.widgets import Input

        from tui.screens.modals import SaveRecipePrompt

        await settle(pilot)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, SaveRecipePrompt), 10, "the save dialog")
        for widget in pilot.app.screen.query(Input):
            widget.cursor_blink = False

    assert snap_compare(wizard("launch"), terminal_size=SMALL, run_before=prompt)


def test_cancel_confirmation(snap_compare, synth: Path) -> None:
    async def confirm(pilot) -> None:
        await settle(pilot)
        from tui.screens.modals import ConfirmScreen

        await pilot.app.push_screen(pilot.app.screen.cancel_dialog())
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen), 10, "the confirmation")

    assert snap_compare(dashboard(synth), terminal_size=SIZE, run_before=confirm)
