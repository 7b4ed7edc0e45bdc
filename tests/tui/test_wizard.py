"""Wizard without launching: live validation next to fields, Launch gating, plan, recipes saved and loaded, CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from textual.widgets import Button

from runner.spec import load_spec, validate
from tests.tui.conftest import fake_estimate, fixed_backends, ready, record_notices, run_async, settle, wait_for
from tests.tui.helpers import fill, text_of
from tui import format as fmt
from tui.app import main, make_app
from tui.screens.modals import PathPrompt, SaveRecipePrompt
from tui.screens.wizard import WizardScreen
from tui.specform import load_recipe_dict, minimal_dict, save_recipe
from tui.widgets.fields import SpecField


def _app(tmp_path: Path, start: str = "wizard", **kw):
    return make_app(tmp_path / "runs", tmp_path / "records", kw.pop("initial_spec", None), start,
                    backends=fixed_backends(), **kw)


def test_bad_value_shows_problem_next_to_field_and_disables_launch(tmp_path: Path) -> None:
    async def go() -> None:
        app = _app(tmp_path, "method")
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await ready(pilot)
            assert isinstance(screen, WizardScreen)
            launch = screen.query_one("#launch", Button)
            assert not launch.disabled and screen.problems == []
            fill(screen, "train.seq_len", "-5")
            field = screen.query_one("#f-train-seq-len", SpecField)
            await wait_for(pilot, lambda: field.has_class("-invalid"), 10, "the problem on train.seq_len")
            problem = text_of(field.query_one(".field-problem"))
            assert "greater than 0" in problem and "-5" in problem and "fix:" in problem
            assert launch.disabled
            assert [p.field for p in screen.problems] == ["train.seq_len"]
            assert "1 problem" in text_of(screen.query_one("#problems"))
            # the step list marks the step holding the problem
            assert "✗1" in str(screen.query_one("#steps").get_option_at_index(3).prompt)
            # a value that does not parse is reported by the schema, not swallowed
            fill(screen, "train.lr", "fast")
            await wait_for(pilot, lambda: len(screen.problems) == 2, 10, "the problem on train.lr")
            assert {p.field for p in screen.problems} == {"train.seq_len", "train.lr"}
            fill(screen, "train.seq_len", "1024")
            fill(screen, "train.lr", "2e-4")
            await wait_for(pilot, lambda: screen.problems == [], 10, "both fields valid")
            assert not launch.disabled and not field.has_class("-invalid")
            assert screen.data["train"]["seq_len"] == 1024 and screen.data["train"]["lr"] == 2e-4

    run_async(go())


def test_cross_field_problem_lands_on_its_field(tmp_path: Path) -> None:
    async def go() -> None:
        app = _app(tmp_path, "model")
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await ready(pilot)
            fill(screen, "model.path", str(tmp_path / "nowhere"))
            field = screen.query_one("#f-model-path", SpecField)
            await wait_for(pilot, lambda: field.has_class("-invalid"), 10, "the problem on model.path")
            assert "no such file or directory" in text_of(field.query_one(".field-problem"))
            notices = record_notices(app)
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: any(t == "Cannot launch" for t, _ in notices), 10, "launch refused")
            await settle(pilot)
            assert screen.step == "model"  # launch refused, stays on the step with the problem

    run_async(go())


def test_lora_fields_show_only_for_lora(tmp_path: Path) -> None:
    async def go() -> None:
        app = _app(tmp_path, "method")
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await ready(pilot)
            r_field = screen.query_one("#f-method-lora-r", SpecField)
            assert not r_field.display
            screen.query_one("#f-method-kind Select").value = "lora"
            await wait_for(pilot, lambda: r_field.display, 10, "the LoRA fields")
            assert screen.data["method"]["kind"] == "lora"
            # output.save=adapter needs LoRA: valid now, a problem on output.save once back to full
            screen.query_one("#f-output-save Select").value = "adapter"
            await wait_for(pilot, lambda: screen.data["output"]["save"] == "adapter", 10, "output.save=adapter")
            assert screen.problems == []
            # QLoRA, offered beside them, takes the same LoRA settings and adapter export
            screen.query_one("#f-method-kind Select").value = "qlora"
            await wait_for(pilot, lambda: screen.data["method"]["kind"] == "qlora", 10, "method.kind=qlora")
            assert r_field.display and screen.problems == []
            screen.query_one("#f-method-kind Select").value = "full"
            await wait_for(pilot, lambda: not r_field.display, 10, "the LoRA fields hidden")
            assert [p.field for p in screen.problems] == ["output.save"]
            assert screen.query_one("#f-output-save", SpecField).has_class("-invalid")

    run_async(go())


def test_plan_shows_verdict_breakdown_sweep_and_command(tmp_path: Path, fixed_python: None) -> None:
    async def go() -> None:
        app = _app(tmp_path, "plan", initial_spec="tiny-cpu")
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await ready(pilot)
            await wait_for(pilot, lambda: screen.sweep is not None, 10, "the sweep table")
            verdict = text_of(screen.query_one("#plan-verdict"))
            est = fake_estimate(screen.plan["spec"])
            assert est["verdict"] == "tight"  # 21.95 of 23.4 GiB
            assert "2 rank(s) on cpu" in verdict and " TIGHT " in verdict and "(approximate)" in verdict
            assert f"{fmt.memory_estimate(est)} of 23.4 GiB host RAM, headroom 1.4 GiB" in verdict
            assert "21.95 GiB needed per rank" in verdict
            # A CPU plan has no table of GPU types (tests/tui/test_screens_80x24.py has the GPU plan's).
            assert not screen.query_one("#sweep").display
            assert "plan for GPUs" in text_of(screen.query_one("#sweep-title"))
            assert text_of(screen.query_one("#plan-commands")) == (
                "python -m torch.distributed.run --nproc-per-node=2 --max-restarts=0 --standalone -m runner.train "
                "--spec 'runs/<id>/spec.json'")
            assert "0:01:52" in text_of(screen.query_one("#plan-time"))  # 150 steps × 0.75 s

    run_async(go())


def test_planned_gpu_target_on_cpu_machine_cannot_launch_here(tmp_path: Path, fixed_python: None) -> None:
    async def go() -> None:
        app = _app(tmp_path, "plan", initial_spec=load_recipe_dict(
            "tiny-cpu", ["hardware.device=cuda", "hardware.gpu=H200", "hardware.nproc_per_node=8",
                         "hardware.nodes=2", "hardware.rdzv_endpoint=node0:29500"]))
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await ready(pilot)
            await wait_for(pilot, lambda: screen.plan is not None, 10, "the plan")
            assert screen.plan["planned"]
            commands = text_of(screen.query_one("#plan-commands"))
            assert "# node 0" in commands and "# node 1" in commands and "--node-rank=1" in commands
            assert "--rdzv-endpoint=node0:29500" in commands
            screen.go("launch")
            await wait_for(pilot, lambda: "planned target" in text_of(screen.query_one("#launch-summary")), 10,
                           "the Launch step's verdict")
            assert screen.query_one("#launch", Button).disabled

    run_async(go())


def test_plan_warns_when_bf16_states_would_round_updates_away(tmp_path: Path, fixed_python: None) -> None:
    async def go() -> None:
        app = _app(tmp_path, "plan", initial_spec=load_recipe_dict(
            "tiny-cpu", ["hardware.device=cuda", "hardware.gpu=H200", "hardware.nproc_per_node=1",
                         "model.dtype=bfloat16", "train.optimizer_precision=bf16", "train.lr=1e-5"]))
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await ready(pilot)
            await wait_for(pilot, lambda: screen.plan is not None, 10, "the plan")
            await wait_for(pilot, lambda: "note:" in text_of(screen.query_one("#plan-verdict")), 10, "the note")
            assert "bf16_stochastic" in text_of(screen.query_one("#plan-verdict"))

    run_async(go())


def test_speed_levers_are_spec_fields_with_their_cross_checks(tmp_path: Path) -> None:
    """recompute layers needs activation checkpointing: with checkpointing auto the planner turns it on; set off, a
    problem on that field until it is on."""

    async def go() -> None:
        app = _app(tmp_path, "method")
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await ready(pilot)
            assert screen.query_one("#f-train-activation-checkpointing Select").value == "auto"
            fill(screen, "train.recompute_layers", "2")
            await wait_for(pilot, lambda: screen.data["train"]["recompute_layers"] == 2, 10, "the edit")
            assert screen.problems == []  # checkpointing auto: the planner turns it on for the lever
            screen.query_one("#f-train-activation-checkpointing Select").value = False
            await wait_for(pilot, lambda: bool(screen.problems), 10, "the problem on train.recompute_layers")
            assert [p.field for p in screen.problems] == ["train.recompute_layers"]
            screen.query_one("#f-train-activation-checkpointing Select").value = True
            screen.query_one("#f-train-loss-impl Select").value = "fused"
            await wait_for(pilot, lambda: screen.data["train"]["activation_checkpointing"] is True and
                           screen.data["train"]["loss_impl"] == "fused", 10, "both edits")
            assert screen.problems == []
            assert screen.data["train"]["recompute_layers"] == 2 and screen.data["train"]["loss_impl"] == "fused"

    run_async(go())


def test_save_then_load_recipe_round_trips(tmp_path: Path) -> None:
    target = tmp_path / "saved" / "my-run.yaml"

    async def go() -> None:
        app = _app(tmp_path, "method")
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await ready(pilot)
            fill(screen, "train.max_steps", "7")
            fill(screen, "train.lr", "5e-4")
            await wait_for(pilot, lambda: screen.data["train"]["max_steps"] == 7 and screen.data["train"]["lr"] == 5e-4,
                           10, "both edits")
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, SaveRecipePrompt), 10, "the save dialog")
            prompt = app.screen
            # the recipe's own name while model, data and method are unchanged
            assert prompt.query_one("#save-name").value == "tiny-cpu"
            prompt.query_one("#save-path").value = str(target)
            await pilot.press("enter")
            await wait_for(pilot, lambda: target.is_file(), 10, "the saved recipe")
            fill(screen, "train.max_steps", "99")
            await wait_for(pilot, lambda: screen.data["train"]["max_steps"] == 99, 10, "max_steps=99")
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, PathPrompt), 10, "the load dialog")
            app.screen.query_one("#path").value = str(target)
            await pilot.press("enter")
            await wait_for(pilot, lambda: screen.data["train"]["max_steps"] == 7, 10, "the loaded recipe")
            assert screen.query_one("#f-train-max-steps Input").value == "7"

    run_async(go())
    saved = yaml.safe_load(target.read_text())
    assert saved["train"] == {"lr": 5e-4, "schedule": "cosine", "warmup_steps": 10, "max_steps": 7}
    expected = load_spec("tiny-cpu", ["train.max_steps=7", "train.lr=5e-4"])
    assert load_spec(target) == expected


def test_minimal_recipe_keeps_only_changes_and_identity() -> None:
    data = load_recipe_dict("tiny-cpu", ["train.seed=3"])
    small = minimal_dict(data)
    assert small["train"]["seed"] == 3
    assert "betas" not in small["train"] and "lora" not in small.get("method", {})
    assert small["model"]["path"] == "embedded:model" and small["name"] == "tiny-cpu"
    assert validate(small) == validate(data)


def test_save_refuses_a_non_yaml_name(tmp_path: Path) -> None:
    from runner.errors import UserError

    with pytest.raises(UserError, match=r"must end in \.yaml or \.yml, got x\.txt: try .*x\.yaml"):
        save_recipe(load_recipe_dict("tiny-cpu"), tmp_path / "x.txt")


def test_cli_headless_goes_through_runner_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`sft-tui --headless` = `runner run` (exec'd in its place): the resolved spec reaches
    runner.cli.session.run_headless unchanged."""
    import os
    import sys

    import runner.cli.main
    import runner.cli.session

    seen = {}

    def fake_run_headless(spec, runs_dir, records_dir, as_json=False, plain=False, node_rank=0, run_id=None,
                          force=False):
        seen.update(spec=spec, runs_dir=runs_dir, records_dir=records_dir, as_json=as_json, plain=plain)
        return 3

    class Execd(Exception):
        pass

    def fake_execv(path, argv):
        seen.update(exec_path=path, argv=argv)
        raise Execd

    monkeypatch.setattr(runner.cli.session, "run_headless", fake_run_headless)
    monkeypatch.setattr(os, "execv", fake_execv)
    with pytest.raises(Execd):
        main(["--headless", "--recipe", "tiny-cpu", "--set", "train.max_steps=5", "--json", "--plain",
              "--runs-dir", str(tmp_path / "r"), "--records-dir", str(tmp_path / "rec")])
    assert seen["exec_path"] == sys.executable and seen["argv"][:4] == [sys.executable, "-m", "runner", "run"]
    code = runner.cli.main.main(seen["argv"][3:])  # what `python -m runner` runs with that command line
    assert code == 3
    assert seen["spec"].train.max_steps == 5 and seen["spec"].hardware.nproc_per_node == 2
    assert seen["runs_dir"] == tmp_path / "r" and seen["records_dir"] == tmp_path / "rec"
    assert seen["as_json"] and seen["plain"]


def test_cli_bad_input_exits_2_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--recipe", "tiny-cpuu"]) == 2
    err = capsys.readouterr().err
    assert "unknown recipe 'tiny-cpuu'" in err and "did you mean 'tiny-cpu'?" in err and "Traceback" not in err
    assert main(["--recipe", "tiny-cpu", "--set", "train.seq_ln=4"]) == 2
    assert "did you mean 'train.seq_len'?" in capsys.readouterr().err
    assert main(["--headless"]) == 2
    assert "--headless needs --recipe" in capsys.readouterr().err


@pytest.mark.parametrize("step,path,value,needle", [
    ("model", "model.path", "/nonexistent/model-dir", "no such file or directory"),
    ("model", "model.revision", "bad rev", "not a branch, tag or commit SHA"),
    ("hardware", "hardware.nproc_per_node", "0", "at least 1"),
    ("method", "train.lr", "-1e-4", "greater than 0"),
])
def test_each_kind_of_wrong_input_is_shown_on_its_field(tmp_path: Path, step: str, path: str, value: str,
                                                      needle: str) -> None:
    async def go() -> None:
        app = _app(tmp_path, step)
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await ready(pilot)
            fill(screen, path, value)
            field = screen.query_one("#f-" + path.replace(".", "-").replace("_", "-"), SpecField)
            await wait_for(pilot, lambda: field.has_class("-invalid"), 10, f"the problem on {path}")
            problem = text_of(field.query_one(".field-problem"))
            assert needle in problem and "fix:" in problem
            assert [p.field for p in screen.problems] == [path]
            assert screen.query_one("#launch", Button).disabled

    run_async(go())


def test_plan_shows_the_disk_the_run_needs_against_the_free_space(tmp_path: Path) -> None:
    asked = []

    def disk(spec, runs_dir, steps):
        asked.append((runs_dir, steps))
        return {"folder": str(tmp_path), "free_bytes": 3 << 20, "needed_bytes": 12 << 20, "fits": False}

    async def go() -> None:
        backends = fixed_backends()
        backends.disk_fn = disk
        app = make_app(tmp_path / "runs", tmp_path / "records", "tiny-cpu", "plan", backends=backends)
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await ready(pilot)
            line = f"disk: 12.0 MiB needed of 3.0 MiB free in {tmp_path}: does not fit"
            await wait_for(pilot, lambda: line in text_of(screen.query_one("#plan-time")), 10, "the disk line")
            assert asked[-1] == (tmp_path / "runs", 150)

    run_async(go())
