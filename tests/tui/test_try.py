"""The Try screen, driven by Pilot from the records browser: both models load in workers, a prompt typed and sent with
the keyboard gets each model's greedy answer (the same tokens `runner generate` gives), and a picture at 80×24.

The run's export is a real model of the embedded architecture, drawn with another seed than the base, so the tuned
and base columns answer differently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runner.record.schema import SCHEMA
from runner.spec import RunSpec, resolve, resolve_embedded
from tests.tui.conftest import run_async, wait_for
from tui.app import make_app

RUN = "20260101-000000-try-4c5d6e"
PROMPT = "Name a colour."


@pytest.fixture(scope="module")
def try_records(tmp_path_factory) -> Path:
    """A records folder with one succeeded run whose export is a full model."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    base = tmp_path_factory.mktemp("try")
    export = base / "runs" / RUN / "export"
    src = str(resolve_embedded("embedded:model"))
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src)).save_pretrained(str(export))
    AutoTokenizer.from_pretrained(src).save_pretrained(str(export))
    spec = resolve(RunSpec(), cuda_available=False, gpu_count=0)
    rec = {"schema": SCHEMA, "id": RUN, "created": "2026-01-01T00:00:00Z", "status": "succeeded",
           "spec": spec.to_dict(), "run_dir": str(export.parent), "estimate": {"arch": {"params_total": 230_080}},
           "metrics": {"steps": 40, "export": {"dir": str(export), "kind": "full", "files": {}}}}
    (base / "records").mkdir()
    (base / "records" / f"{RUN}.json").write_text(json.dumps(rec))
    return base / "records"


def _answered(app) -> bool:
    sides = getattr(app.screen, "sides", {})
    return bool(sides) and all(s.messages and s.messages[-1]["role"] == "assistant" for s in sides.values())


async def _ask(pilot) -> None:
    await wait_for(pilot, lambda: pilot.app.screen.query("#records").first().row_count == 1, 30, "the record")
    await pilot.press("t")
    await wait_for(pilot, lambda: hasattr(pilot.app.screen, "sides") and all(
        s.model is not None or s.error for s in pilot.app.screen.sides.values()), 120, "both models loaded")
    assert not [s.error for s in pilot.app.screen.sides.values() if s.error]
    for key in PROMPT:
        await pilot.press("space" if key == " " else key)
    await pilot.press("enter")
    await wait_for(pilot, lambda: _answered(pilot.app), 120, "both answers")
    for widget in pilot.app.screen.query("Input"):
        widget.cursor_blink = False
    await pilot.pause()


def test_try_screen_answers_with_both_models_from_the_records_browser(try_records: Path, tmp_path: Path):
    run_async(_walk(try_records, tmp_path))


async def _walk(try_records: Path, tmp_path: Path) -> None:
    from runner.train.generate import load_for_try

    app = make_app(runs_dir=tmp_path, records_dir=try_records, start_screen="records")
    async with app.run_test(size=(80, 24)) as pilot:
        await _ask(pilot)
        screen = app.screen
        tuned, base = screen.sides["tuned"], screen.sides["base"]
        assert tuned.model.source == "export (full)" and base.model.source.startswith("base model")
        record = json.loads((try_records / f"{RUN}.json").read_text())
        for side, is_base in ((tuned, False), (base, True)):
            expected = load_for_try(record, base=is_base).answer([{"role": "user", "content": PROMPT}], 96).text
            assert side.messages == [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": expected}]
        assert tuned.messages[-1] != base.messages[-1]
        shown = str(screen.query_one("#try-tuned-text").render())
        assert shown.startswith(f"you: {PROMPT}") and shown.endswith(tuned.messages[-1]["content"][-20:])
        # a second turn goes on the same conversation; ctrl+n forgets it
        await pilot.press("o", "k", "enter")
        await wait_for(pilot, lambda: len(tuned.messages) == 4 and _answered(app), 120, "the second answers")
        await pilot.press("ctrl+n")
        assert tuned.messages == [] and base.messages == []
        await pilot.press("escape")
        assert app.screen.__class__.__name__ == "RecordsScreen"


def test_try_screen_80x24(snap_compare, try_records: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    app = make_app(runs_dir=tmp_path, records_dir=try_records, start_screen="records")
    assert snap_compare(app, terminal_size=(80, 24), run_before=_ask)


def test_opening_the_try_screen_loads_no_torch_on_the_ui_thread() -> None:
    import subprocess
    import sys

    code = "import sys, tui.screens.tryout; print('torch' in sys.modules, 'transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.split() == ["False", "False"]
