"""The wizard's background checks: architecture, dataset preview, plan, what-if sweep and preflight, each in a worker
thread that posts its result for the spec key it was computed for (a result for an older spec is dropped)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual import work
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Static
from textual.worker import get_current_worker

from runner import api
from runner.errors import Problem, UserError
from runner.spec import RunSpec, validate
from tui.backends import SWEEP_GPU_TYPES, SWEEP_METHODS, SWEEP_SEQ_LENS, EstimatorUnavailable, sweep_grid
from tui.screens.wizard.fields import ARCH_INPUTS, DATA_INPUTS, spec_key
from tui.screens.wizard.render import (render_arch, render_detect, render_packing, render_plan, render_sweep,
                                       render_tokens)

DEBOUNCE_S = 0.4


class WizardChecks(Screen):
    """Part of WizardScreen: the checks an edit schedules (debounced) and what their results show."""

    @dataclass
    class PlanReady(Message):
        key: str
        plan: dict[str, Any]

    @dataclass
    class SweepReady(Message):
        key: str
        sweep: dict[str, Any]

    @dataclass
    class PreflightReady(Message):
        key: str
        problems: list[Problem] | None
        note: str | None

    @dataclass
    class ArchReady(Message):
        key: str
        arch: dict[str, Any] | None
        error: str | None

    @dataclass
    class DataReady(Message):
        key: str
        preview: dict[str, Any] | None
        error: str | None
        problems: list[Problem] | None = None  # an error's problems: they keep Launch off

    @dataclass
    class GpusReady(Message):
        gpus: list[dict[str, Any]]

    @dataclass
    class WeightsChecked(Message):
        path: str
        weights: bool | None  # None: no model folder there (no config.json)

    def _schedule(self, what: str, delay_s: float = DEBOUNCE_S) -> None:
        timer = self._debounce.pop(what, None)
        if timer is not None:
            timer.stop()
        self._debounce[what] = self.set_timer(max(delay_s, 0.01), lambda: self._start(what))

    def _start(self, what: str) -> None:
        self._debounce.pop(what, None)
        if what == "weights":
            path = self.data.get("model", {}).get("path")
            if path:
                self.check_weights(str(path))
        elif what == "arch":
            key = spec_key(self.data, ARCH_INPUTS)
            if self._keys.get("arch") != key:
                self._keys["arch"] = key
                self.query_one("#arch", Static).update(Content("reading the architecture…").stylize("$text-muted"))
                self.load_arch(copy.deepcopy(self.data), key)
        elif what == "data":
            key = spec_key(self.data, DATA_INPUTS)
            if self._keys.get("data") != key:
                self._keys["data"] = key
                self.data_problems = []
                self.query_one("#data-detect", Static).update(
                    Content("loading the tokenizer and a sample…").stylize("$text-muted"))
                # What was shown belongs to the previous tokenizer or file: never leave it under the new choice.
                self.query_one("#data-preview", Static).update("")
                self.query_one("#data-packing", Static).update("")
                self.load_preview(copy.deepcopy(self.data), key)
        elif what == "plan":
            key = spec_key(self.data)
            if self._keys.get("plan") != key:
                self._keys["plan"] = key
                self.sweep = None
                self.preflight = None
                self.plan_complete = False
                self._show_blockers()
                self.query_one("#plan-preflight", Static).update(Content("preflight: checking…").stylize(
                    "$text-muted"))
                self.query_one("#plan-verdict", Static).update(Content("computing the plan…").stylize("$text-muted"))
                self.compute_plan(copy.deepcopy(self.data), key)

    @work(thread=True, exclusive=True, exit_on_error=False, group="gpus")
    def detect_gpus(self) -> None:
        self.post_message(self.GpusReady(self.app.detected_gpus()))

    def on_wizard_checks_gpus_ready(self, message: GpusReady) -> None:
        # The plan needs no recomputing: its worker asks the app for the same (cached) detection.
        self.gpus = message.gpus
        self._update_hardware()
        self._update_launch()

    @work(thread=True, exclusive=True, exit_on_error=False, group="weights")
    def check_weights(self, path: str) -> None:
        from runner.spec import resolve_embedded

        folder = Path(resolve_embedded(path))
        self.post_message(self.WeightsChecked(path, api.has_weights(folder) if (folder / "config.json").is_file()
                                              else None))

    def on_wizard_checks_weights_checked(self, message: WeightsChecked) -> None:
        """A model folder without weights (config.json and tokenizer alone) can only start from random weights:
        model.init is set to random for it, and back to pretrained for a folder with weights, unless it was chosen
        here."""
        if message.path != self.data.get("model", {}).get("path") or message.weights is None or self.init_chosen:
            return
        init = self.data.get("model", {}).get("init")
        if not message.weights and init == "pretrained":
            self.init_proposed = True
            self.set_field("model.init", "random")
            self.notify(f"{message.path} holds config.json but no weights: model.init is now random (initialised "
                        "from the config with train.seed); set it to pretrained once weights are there",
                        title="Random init", timeout=8)
        elif message.weights and init == "random" and self.init_proposed:
            self.init_proposed = False
            self.set_field("model.init", "pretrained")
            self.notify(f"{message.path} holds weights: model.init is pretrained again", title="Pretrained",
                        timeout=6)

    @work(thread=True, exclusive=True, exit_on_error=False, group="arch")
    def load_arch(self, data: dict[str, Any], key: str) -> None:
        try:
            spec = validate(data)
            arch = self.app.backends.load_arch(spec)
            self.post_message(self.ArchReady(key, arch, None))
        except (UserError, EstimatorUnavailable) as e:
            self.post_message(self.ArchReady(key, None, str(e)))
        except Exception as e:  # noqa: BLE001 - shown to the user, the wizard stays usable
            self.post_message(self.ArchReady(key, None, f"{type(e).__name__}: {e}"))

    def on_wizard_checks_arch_ready(self, message: ArchReady) -> None:
        if message.key != self._keys.get("arch"):
            return
        widget = self.query_one("#arch", Static)
        if message.error:
            widget.update(Content(f"architecture: {message.error}").stylize("$text-muted"))
            return
        widget.update(render_arch(message.arch or {}))

    @work(thread=True, exclusive=True, exit_on_error=False, group="data")
    def load_preview(self, data: dict[str, Any], key: str) -> None:
        spec = None
        try:
            spec = validate(data)
            unreachable = api.hub_problems(spec)
            if unreachable:  # said in seconds, not after the hub client's retries
                self.post_message(self.DataReady(key, None, "; ".join(map(str, unreachable)), unreachable))
                return
            preview = api.preview_tokens(spec)
            found: list[Problem] = []
            if (preview.get("detect") or {}).get("messages_ok") is False:  # shown with ✗: it blocks Launch too
                found = self._data_preflight(spec) or [Problem("dataset", "no conversation in the rows' format")]
            self.post_message(self.DataReady(key, preview, None, found))
        except UserError as e:
            self.post_message(self.DataReady(key, None, str(e), e.problems or [Problem("dataset", str(e))]))
        except Exception as e:  # noqa: BLE001 - a bad file or tokenizer is shown, not raised
            problems = self._data_preflight(spec) if spec is not None else []
            text = "; ".join(map(str, problems)) or f"{type(e).__name__}: {e}"
            self.post_message(self.DataReady(key, None, text, problems or [Problem("dataset", text)]))

    def _data_preflight(self, spec: RunSpec) -> list[Problem]:
        """Preflight's model and dataset findings: what `runner run` would say about the same input."""
        try:
            resolved, _ = api.resolve_for(spec, self.app.detected_gpus())
            problems = self.app.backends.preflight(resolved)
        except Exception:  # noqa: BLE001 - then the preview's own error is shown
            return []
        return [p for p in problems if p.field.startswith(("dataset", "model"))]

    def on_wizard_checks_data_ready(self, message: DataReady) -> None:
        if message.key != self._keys.get("data"):
            return
        detect_w = self.query_one("#data-detect", Static)
        preview_w = self.query_one("#data-preview", Static)
        packing_w = self.query_one("#data-packing", Static)
        self.data_problems = list(message.problems or [])
        self._show_blockers()
        if message.error:
            detect_w.update(Content(f"✗ {message.error}").stylize("$text-error"))
            preview_w.update("")
            packing_w.update("")
            return
        p = message.preview or {}
        detect_w.update(render_detect(p.get("detect") or {}))
        preview_w.update(render_tokens(p) if p.get("tokens") else "")
        packing_w.update(render_packing(p) if p.get("pack") else "")

    @work(thread=True, exclusive=True, exit_on_error=False, group="plan")
    def compute_plan(self, data: dict[str, Any], key: str) -> None:
        """Resolve for this machine (or the planned target), estimate, torchrun commands; then the sweep."""
        worker = get_current_worker()
        plan: dict[str, Any] = {}
        try:
            spec = validate(data)
            gpus = self.app.detected_gpus()
            resolved, planned = api.resolve_for(spec, gpus)
        except UserError as e:
            self.post_message(self.PlanReady(key, {"error": str(e)}))
            return
        plan.update(spec=resolved, planned=planned)
        try:
            plan["estimate"] = self.app.backends.estimate(resolved)
            plan["disk"] = self.app.backends.disk(resolved, self.app.runs_dir, plan["estimate"].get("steps"))
        except EstimatorUnavailable as e:
            plan["estimate_error"] = str(e)
        except UserError as e:
            plan["estimate_error"] = str(e)
        except Exception as e:  # noqa: BLE001
            plan["estimate_error"] = f"the estimator failed: {type(e).__name__}: {e}"
        try:
            plan["commands"] = api.launch_commands(resolved)
        except Exception as e:  # noqa: BLE001
            plan["command_error"] = f"{type(e).__name__}: {e}"
        self.post_message(self.PlanReady(key, plan))
        if worker.is_cancelled:
            return
        self.post_message(self.SweepReady(key, self._sweep(resolved, spec)))
        if worker.is_cancelled:
            return
        self.post_message(self._preflight(key, resolved, planned))

    def _preflight(self, key: str, resolved: RunSpec, planned: bool) -> PreflightReady:
        try:
            problems = self.app.backends.preflight(resolved)
        except (EstimatorUnavailable, UserError) as e:
            return self.PreflightReady(key, None, str(e))
        except Exception as e:  # noqa: BLE001
            return self.PreflightReady(key, None, f"preflight failed: {type(e).__name__}: {e}")
        if planned:
            # Visible-GPU checks are about this machine, which a planned target is not.
            problems = [p for p in problems if not p.field.startswith("hardware.")]
            return self.PreflightReady(key, problems, "GPU checks skipped for a planned target")
        check = None
        if not problems:
            try:
                check = self.app.backends.packing_check(resolved)
            except Exception as e:  # noqa: BLE001 - the verdict is shown, not required, once preflight passed
                check = f"packing check: not shown ({type(e).__name__}: {e})"
        return self.PreflightReady(key, problems, check)

    def on_wizard_checks_preflight_ready(self, message: PreflightReady) -> None:
        if message.key != self._keys.get("plan"):
            return
        self.preflight = message.problems
        self.plan_complete = True
        self._show_blockers()
        self._queued_launch()
        widget = self.query_one("#plan-preflight", Static)
        if message.problems is None:
            widget.update(Content(f"preflight: {message.note}").stylize("$text-muted"))
            return
        note = Content(f" ({message.note})").stylize("$text-muted") if message.note else Content("")
        if not message.problems:
            widget.update(Content("✓ preflight: data, chat template, packing, attention, LoRA targets and GPUs "
                                  "check out").stylize("$text-success") + note)
            return
        lines = [Content(f"✗ preflight found {len(message.problems)} problem(s):").stylize("bold $text-error") + note]
        lines += [Content(f"  {p}").stylize("$text-error") for p in message.problems]
        widget.update(Content("\n").join(lines))

    def _sweep(self, resolved: RunSpec, spec: RunSpec) -> dict[str, Any]:
        gpu_types = list(SWEEP_GPU_TYPES)
        if resolved.hardware.gpu != "auto" and resolved.hardware.gpu not in gpu_types:
            gpu_types.append(resolved.hardware.gpu)
        seq_lens = sorted({*SWEEP_SEQ_LENS, resolved.train.seq_len})
        axes = [("train.seq_len", seq_lens), ("hardware.gpu", gpu_types)]
        if resolved.hardware.device == "cpu":
            # The what-if compares GPU types: on a CPU plan a table of GPUs answers a question nobody asked (and
            # takes the 80×24 pane); it says where to ask it.
            return {"cpu": True}
        target = api.sweep_target(spec, resolved)
        try:
            rows = self.app.backends.sweep(target, axes)
        except Exception as e:  # noqa: BLE001 - EstimatorUnavailable, UserError or a bug: shown in the table title
            return {"error": str(e) if isinstance(e, (UserError, EstimatorUnavailable)) else
                    f"{type(e).__name__}: {e}"}
        return {"axes": axes, "grid": sweep_grid(rows, axes), "ranks": target.hardware.nproc_per_node,
                "methods": self._methods(target)}

    def _methods(self, target: RunSpec) -> list[dict[str, Any]]:
        """The run as a full fine-tune, LoRA and QLoRA, for the line under the grid; none when they cannot be
        planned (the grid's title says what failed)."""
        try:
            return self.app.backends.sweep(target, [("method.kind", list(SWEEP_METHODS))])
        except Exception:  # noqa: BLE001 - see above
            return []

    def on_wizard_checks_plan_ready(self, message: PlanReady) -> None:
        if message.key != self._keys.get("plan"):
            return
        self.plan = message.plan
        render_plan(self, message.plan)
        if message.plan.get("error"):
            self.plan_complete = True
            self._queued_launch()
        self._show_blockers()

    def on_wizard_checks_sweep_ready(self, message: SweepReady) -> None:
        if message.key != self._keys.get("plan"):
            return
        self.sweep = message.sweep
        render_sweep(self, message.sweep, self.plan or {})
