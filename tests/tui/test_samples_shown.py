"""The dashboard shows the latest answer to each of train.eval_prompts with its step, one line each, and nothing
of the kind for a run without prompts; a picture at 80×24."""

from __future__ import annotations

from pathlib import Path

from runner.events.lines import EventWriter
from tests.tui.conftest import CLOCK_T, DASH_ID, T0, fixed_backends, run_async, settle
from tui.app import make_app


def _add_samples(synth: Path) -> None:
    w = EventWriter(synth / "runs" / DASH_ID / "events" / "rank0.jsonl", rank=0)
    for step, index, text in [(20, 0, "The word"), (20, 1, "Ottawa"), (40, 0, "The capital of Canada is Ottawa.")]:
        w.write(t=T0 + 10 + step * 0.5, event="sample", step=step, index=index,
                prompt=["Name the capital city of Canada.", "Count the letters in\ngarden."][index], text=text)
    w.close()


def _app():
    return make_app("runs", "records", "tiny-cpu", "dashboard", run_dir=Path("runs") / DASH_ID,
                    backends=fixed_backends(), clock=lambda: CLOCK_T, poll_s=60.0)


def test_dashboard_shows_each_prompts_latest_answer_with_its_step(synth: Path) -> None:
    async def go(with_samples: bool) -> str:
        app = _app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            widget = app.screen.query_one("#samples")
            return str(widget.render()) if widget.display else ""

    assert run_async(go(False)) == ""
    _add_samples(synth)
    shown = run_async(go(True))
    assert shown.splitlines() == ["step 40  Name the capital city of Canada. → The capital of Canada is Ottawa.",
                                  "step 20  Count the letters in garden. → Ottawa"]


def test_dashboard_with_samples_80x24(snap_compare, synth: Path) -> None:
    _add_samples(synth)
    assert snap_compare(_app(), terminal_size=(80, 24), run_before=settle)
