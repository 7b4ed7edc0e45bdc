"""Keys as a fast typist sends them at 80×24: all at once after ^n (the terminal delivers them in one read), the help
line on the field that has the focus, and a field's long meaning shown whole or up to a sentence's end."""

from __future__ import annotations

from pathlib import Path

from textual import events
from textual.widgets import Input

from tests.tui.conftest import fixed_backends, ready, run_async, settle, wait_for
from tests.tui.helpers import text_of
from tui.app import make_app
from tui.screens.modals import TextScreen
from tui.screens.wizard.fields import HELP_LINES, MORE_HELP, fit_help


def send_at_once(app, keys: list[str]) -> None:
    """Queue every key before the app handles the first, as keys typed without a pause arrive."""
    for key in keys:
        event = events.Key(key, key if len(key) == 1 else None)
        event.set_sender(app)
        app._driver.send_message(event)


def test_keys_typed_right_after_ctrl_n_land_where_the_focus_is_when_typed(tmp_path: Path) -> None:
    """^n, Tab and a path sent in one go: the path lands in the Dataset step's local path (the focus move of ^n
    arrived late, after the Tab, and took the keys to "hub id / name"), and the help line describes that field."""
    data = tmp_path / "lima.jsonl"

    async def go() -> None:
        app = make_app(tmp_path / "runs", tmp_path / "records", None, "wizard", backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            wiz = await ready(pilot)
            await settle(pilot)
            dataset_id = wiz.data["dataset"]["id"]
            send_at_once(app, ["ctrl+n", "tab", *str(data)])
            await wait_for(pilot, lambda: wiz.data["dataset"]["path"] == str(data), 20, "the typed path")
            await settle(pilot)
            assert wiz.step == "dataset"
            assert wiz.query_one("#f-dataset-path Input", Input).value == str(data)
            assert app.focused is wiz.query_one("#f-dataset-path Input", Input)
            # The id was not typed into: it follows the path (local/<name>), as it does for a typed path.
            assert wiz.data["dataset"]["id"] == "local/lima" != dataset_id
            assert text_of(wiz.query_one("#help")).startswith("dataset.id is now local/lima")
            # Then ^n again, typed at once with more keys: the help line is the new step's focused field's.
            send_at_once(app, ["ctrl+n", "tab"])
            await wait_for(pilot, lambda: wiz.step == "hardware", 10, "the Hardware step")
            await settle(pilot)
            assert app.focused is wiz.query_one("#f-hardware-gpu").control
            assert text_of(wiz.query_one("#help")).startswith("hardware.gpu (default")

    run_async(go())


def test_the_help_line_describes_the_new_steps_field_after_ctrl_n(tmp_path: Path) -> None:
    async def go() -> None:
        app = make_app(tmp_path / "runs", tmp_path / "records", None, "wizard", backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            wiz = await ready(pilot)
            await settle(pilot)
            assert text_of(wiz.query_one("#help")).startswith("model.id (default")
            for step, first in (("dataset", "dataset.id"), ("hardware", "hardware.device"), ("method", "engine")):
                await pilot.press("ctrl+n")
                await wait_for(pilot, lambda: wiz.step == step, 10, step)
                await settle(pilot)
                assert text_of(wiz.query_one("#help")).startswith(f"{first} (default"), step

    run_async(go())


def test_a_long_field_meaning_ends_at_a_sentence_and_f1_shows_it_whole(tmp_path: Path) -> None:
    """At 80×24 the help line holds 5 rows: a longer meaning ends where a sentence or clause ends, never
    mid-sentence, and says that F1 shows the rest; F1 shows all of it. Every field's meaning is cut by the help
    line's own rule at the help line's width; the help line shows that as the focus reaches each cut field and one
    whole one (focusing all ~50 fields in turn cost 0.2 s of layout apiece)."""
    async def go() -> None:
        app = make_app(tmp_path / "runs", tmp_path / "records", None, "method", backends=fixed_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            wiz = await ready(pilot)
            await settle(pilot)
            help_w = wiz.query_one("#help")
            width = help_w.size.width - 2
            fields = [f for f in wiz.query("SpecField") if f.display]
            cut = []
            for field in fields:
                shown = fit_help(field.doc, width, HELP_LINES)
                if shown == field.doc:
                    continue
                cut.append(field)
                assert shown.endswith(MORE_HELP), (field.path, shown)
                head = shown[: -len(MORE_HELP)]
                assert field.doc.startswith(head.removesuffix(" …")), field.path
                assert head.endswith((".", ";", ":", " …")), (field.path, head)
                # The whole text fits in the help line's rows (nothing hidden under its last row).
                assert len(wrap(shown, help_w.content_size.width)) <= HELP_LINES, (field.path, shown)
            assert cut, "no field's meaning was long enough to be cut at 80 columns"
            whole = next(f for f in fields if f not in cut)
            for field in (whole, *cut):  # the help line ends on a cut meaning, which F1 shows whole
                wiz.set_focus(field.control)
                await pilot.pause()  # the help line follows the focus in the same message round
                assert text_of(help_w) == fit_help(field.doc, width, HELP_LINES), field.path
                assert help_w.size.height <= HELP_LINES
            await pilot.press("f1")
            await wait_for(pilot, lambda: isinstance(app.screen, TextScreen), 10, "the whole meaning")
            assert text_of(app.screen.query_one("#text-body Static")) == wiz.full_help == cut[-1].doc
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is wiz, 10, "back to the wizard")

    run_async(go())


def wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width)


def test_fit_help_cuts_at_a_sentence_end() -> None:
    text = "a.b (default 1): First sentence here. Second one is longer than the rest of it; and a clause. Last."
    assert fit_help(text, 80, 5) == text
    assert fit_help(text, 30, 3) == "a.b (default 1): First sentence here." + MORE_HELP
    long_one = "x " * 200
    shown = fit_help(long_one, 40, 2)
    assert shown.endswith(" …" + MORE_HELP) and len(wrap(shown, 40)) <= 2
