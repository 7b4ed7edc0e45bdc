"""A model folder of config.json and tokenizer alone, from the wizard: the Model step's init field, random proposed for
a folder without weights, and preflight's finding kept on that field and in the bar through Ctrl+S."""

from __future__ import annotations

import shutil
from pathlib import Path

from textual.widgets import Select

from tests.tui.conftest import (fake_arch, fake_estimate, fake_sweep, ready, record_notices, run_async, settle,
                                wait_for)
from tests.tui.helpers import fill, text_of
from tui.app import make_app
from tui.backends import Backends
from tui.screens.modals import SaveRecipePrompt
from tui.widgets.fields import SpecField

REPO = Path(__file__).resolve().parents[2]


def config_only_folder(tmp_path: Path) -> Path:
    """The embedded model's folder without its weights (a reduced architecture as one writes it by hand)."""
    folder = tmp_path / "llama-tiny-config"
    shutil.copytree(REPO / "recipes" / "embedded" / "model", folder,
                    ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    return folder


def real_preflight_backends() -> Backends:
    """The estimate is pinned (it is not under test); preflight is the one `runner run` runs."""
    return Backends(estimate_fn=fake_estimate, sweep_fn=fake_sweep, load_arch_fn=fake_arch, detect_gpus_fn=lambda: [],
                    gpu_types_list=("H100-80GB", "H200"))


def test_a_config_only_folder_gets_random_init_and_preflight_stays_shown_through_ctrl_s(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    folder = config_only_folder(tmp_path)
    monkeypatch.chdir(tmp_path)

    async def go() -> None:
        app = make_app(tmp_path / "runs", tmp_path / "records", None, "wizard", backends=real_preflight_backends())
        notices = record_notices(app)
        async with app.run_test(size=(80, 24)) as pilot:
            wiz = await ready(pilot)
            init = wiz.query_one("#f-model-init", SpecField)
            assert init.display and init.control.value == "pretrained"
            fill(wiz, "model.path", str(folder))
            await wait_for(pilot, lambda: wiz.data["model"]["init"] == "random", 30, "random init proposed")
            assert init.control.value == "random"
            assert any("no weights" in message and "model.init is now random" in message for _, message in notices)
            # Chosen here: pretrained again, which preflight refuses for this folder.
            init.control.value = "pretrained"
            await wait_for(pilot, lambda: wiz.data["model"]["init"] == "pretrained", 10, "pretrained chosen")
            for _ in range(5):
                await pilot.press("ctrl+n")
            await wait_for(pilot, lambda: wiz.step == "launch" and wiz.plan_complete, 120, "preflight")
            await settle(pilot)
            assert init.has_class("-invalid")
            assert "set model.init=random" in text_of(init.query_one(".field-problem"))
            bar = text_of(wiz.query_one("#problems"))
            assert bar.startswith("✗ 1 problem: model.init: pretrained, but"), bar
            assert "✗1" in str(wiz.query_one("#steps").get_option_at_index(0).prompt)
            # Ctrl+S names and describes the recipe: no new check, and what preflight found still stands.
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, SaveRecipePrompt), 10, "the save dialog")
            app.screen.query_one("#save-path").value = str(tmp_path / "saved.yaml")
            await pilot.press("enter")
            await wait_for(pilot, lambda: (tmp_path / "saved.yaml").is_file(), 10, "the saved recipe")
            await settle(pilot)
            assert init.has_class("-invalid")
            assert text_of(wiz.query_one("#problems")).startswith("✗ 1 problem: model.init"), \
                text_of(wiz.query_one("#problems"))
            assert wiz.query_one("#launch").disabled
            # random again: preflight passes, Launch is on.
            init.control.value = "random"
            await wait_for(pilot, lambda: wiz.data["model"]["init"] == "random" and wiz.plan_complete, 120,
                           "preflight of the random init")
            await settle(pilot)
            assert not init.has_class("-invalid") and wiz.preflight == []
            assert text_of(wiz.query_one("#problems")) == "✓ spec is valid"
            assert not wiz.query_one("#launch").disabled

    run_async(go())


def test_random_init_goes_back_to_pretrained_for_a_folder_with_weights(tmp_path: Path) -> None:
    """Proposed, not imposed: a path with weights takes back what the wizard proposed; a choice made here stays."""
    folder = config_only_folder(tmp_path)

    async def go() -> None:
        app = make_app(tmp_path / "runs", tmp_path / "records", None, "wizard", backends=real_preflight_backends())
        async with app.run_test(size=(80, 24)) as pilot:
            wiz = await ready(pilot)
            init = wiz.query_one("#f-model-init", SpecField).control
            assert isinstance(init, Select)
            fill(wiz, "model.path", str(folder))
            await wait_for(pilot, lambda: wiz.data["model"]["init"] == "random", 30, "random init proposed")
            fill(wiz, "model.path", str(REPO / "recipes" / "embedded" / "model"))
            await wait_for(pilot, lambda: wiz.data["model"]["init"] == "pretrained", 30, "pretrained again")
            assert init.value == "pretrained"
            init.value = "random"  # the user's own choice
            await wait_for(pilot, lambda: wiz.data["model"]["init"] == "random", 10, "random chosen")
            fill(wiz, "model.path", str(REPO / "recipes" / "embedded" / "model") + "/")
            await settle(pilot)
            assert wiz.data["model"]["init"] == "random"

    run_async(go())
