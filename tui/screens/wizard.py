"""The wizard: Model → Dataset → Hardware → Method → Plan → Launch over one spec dict, validated live."""

from __future__ import annotations

import copy
import json
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Button, ContentSwitcher, Footer, Header, OptionList, Static
from textual.widgets.option_list import Option
from textual.worker import get_current_worker

from runner.errors import Problem, UserError
from runner.plan.preflight import precision_advice
from runner.spec import RunSpec, field_choices, field_docs, optimizer_precision, spec_warnings, validate, weights_dtype
from tui import format as fmt
from tui.backends import SWEEP_GPU_TYPES, SWEEP_SEQ_LENS, EstimatorUnavailable, sweep_grid
from tui.specform import field_of, get_path, plan_resolve, problems_of, set_path
from tui.widgets.fields import Kind, SpecField
from tui.widgets.membar import MemoryBar

STEPS = (("model", "Model"), ("dataset", "Dataset"), ("hardware", "Hardware"), ("method", "Method"),
         ("plan", "Plan"), ("launch", "Launch"))
STEP_IDS = [s for s, _ in STEPS]

# (dotted path, label, kind) per step; options of selects come from the schema's Literal types.
FIELDS: dict[str, list[tuple[str, str, Kind]]] = {
    "model": [
        ("model.id", "hub id / name", "text"),
        ("model.path", "local path", "optional"),
        ("model.revision", "revision", "optional"),
        ("model.dtype", "dtype", "select"),
        ("model.attn_implementation", "attention", "select"),
        ("model.loader", "loader", "select"),
        ("model.trust_remote_code", "trust remote code", "switch"),
    ],
    "dataset": [
        ("dataset.id", "hub id / name", "optional"),
        ("dataset.path", "local path", "optional"),
        ("dataset.revision", "revision", "optional"),
        ("dataset.split", "split", "text"),
        ("dataset.messages_field", "messages column", "text"),
    ],
    "hardware": [
        ("hardware.device", "device", "select"),
        ("hardware.gpu", "GPU type", "select"),
        ("hardware.nproc_per_node", "ranks per node", "int_or_auto"),
        ("hardware.nodes", "nodes", "int"),
        ("hardware.rdzv_endpoint", "rendezvous host:port", "text"),
    ],
    "method": [
        ("engine", "engine", "select"),
        ("method.kind", "method", "select"),
        ("method.lora.r", "LoRA r", "int"),
        ("method.lora.alpha", "LoRA alpha", "int"),
        ("method.lora.target_modules", "LoRA targets", "modules"),
        ("train.seq_len", "tokens per block", "int"),
        ("train.micro_batch", "micro batch", "int"),
        ("train.grad_accum", "grad accumulation", "int"),
        ("train.lr", "learning rate", "float"),
        ("train.schedule", "schedule", "select"),
        ("train.warmup_steps", "warmup steps", "int"),
        ("train.max_steps", "max steps", "optional_int"),
        ("train.epochs", "epochs (no max)", "float"),
        ("train.activation_checkpointing", "act. checkpointing", "select"),
        ("train.recompute_layers", "recompute layers", "optional_int"),
        ("train.offload_activations", "offload activations", "select"),
        ("train.compile", "compile layers", "select"),
        ("train.loss_impl", "loss", "select"),
        ("train.packing_strategy", "packing", "select"),
        ("dataset.eval_fraction", "eval fraction", "float"),
        ("dataset.eval_split", "eval split", "optional"),
        ("train.eval_every", "eval every (steps)", "int"),
        ("train.early_stop_patience", "early stop patience", "int"),
        ("report.to", "trackers", "list"),
        ("output.save", "save at end", "select"),
    ],
    "launch": [
        ("name", "run name", "text"),
        ("description", "description", "text"),
    ],
}
ALL_FIELDS = [p for fields in FIELDS.values() for p, _, _ in fields]
STEP_OF_FIELD = {p: step for step, fields in FIELDS.items() for p, _, _ in fields}
STEP_OF_SECTION = {"model": "model", "dataset": "dataset", "hardware": "hardware", "method": "method",
                   "train": "method", "output": "method", "engine": "method", "name": "launch", "description": "launch"}
LORA_FIELDS = ("method.lora.r", "method.lora.alpha", "method.lora.target_modules")
# Which panes' background work an edit makes stale.
ARCH_INPUTS = ("model.",)
DATA_INPUTS = ("model.", "dataset.", "train.seq_len", "train.packing_strategy")
DEBOUNCE_S = 0.4
HELP_HINT = "tab/shift+tab: fields · ^n/^p: next/previous step · a focused field's meaning shows here"
STEP_HELP = {
    "plan": "↑/↓, PgUp/PgDn, Home/End: scroll the plan (the torchrun command is at its end) · ^n: on to Launch",
    "launch": "^l: launch · ^s: save these choices as a recipe · ^o: load a recipe · tab: run name, description",
}


def literal_options(path: str) -> list[Any]:
    """The allowed values of a Literal-typed spec field, from the schema itself."""
    model: Any = RunSpec
    ann: Any = None
    for part in path.split("."):
        ann = model.model_fields[part].annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            model = ann
    out: list[Any] = []
    for arg in typing.get_args(ann) or ():
        out += list(typing.get_args(arg)) if typing.get_origin(arg) is typing.Literal else []
        out += [True, False] if arg is bool else []  # a speed lever: auto, or set on or off
    if typing.get_origin(ann) is typing.Literal:
        out = list(typing.get_args(ann))
    return out


class StepList(OptionList):
    """The step list. Home/End/PgUp/PgDn scroll the shown step's pane instead of jumping to the first or last step
    (End on Plan used to land on Launch); ↑/↓ still walk the steps."""

    BINDINGS = [
        Binding("home", "scroll_pane('home')", show=False),
        Binding("end", "scroll_pane('end')", show=False),
        Binding("pageup", "scroll_pane('page_up')", show=False),
        Binding("pagedown", "scroll_pane('page_down')", show=False),
    ]

    def action_scroll_pane(self, how: str) -> None:
        screen = self.screen
        if isinstance(screen, WizardScreen):
            screen.scroll_pane(how)


def spec_key(data: dict[str, Any], prefixes: tuple[str, ...] = ("",)) -> str:
    flat = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            flat[prefix[:-1]] = node

    walk(data, "")
    return json.dumps({k: v for k, v in flat.items() if any(k.startswith(p) for p in prefixes)}, sort_keys=True,
                      default=str)


VERDICT_TOKEN = {"fits": "success", "tight": "warning", "does not fit": "error"}


class WizardScreen(Screen):
    """The spec being built lives in `self.data` (a full raw dict); every edit revalidates the whole of it."""

    BINDINGS = [
        Binding("ctrl+n", "next_step", "Next", priority=True),
        Binding("ctrl+p", "prev_step", "Back", priority=True),
        Binding("ctrl+l", "launch", "Launch", priority=True),
        Binding("ctrl+s", "save_recipe", "Save", priority=True),
        Binding("ctrl+o", "load_recipe", "Load", priority=True),
    ]

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

    def __init__(self, data: dict[str, Any], step: str = "model", recipe: str | None = None) -> None:
        super().__init__()
        self.data = data
        self.recipe = recipe  # the recipe the choices came from (title, and what Ctrl+S proposes)
        self.origin = copy.deepcopy(data)  # as loaded: Ctrl+S renames a recipe whose model or data changed
        self.step = step if step in STEP_IDS else "model"
        self.first_step = self.step
        self.ready = False  # every pane is mounted (see _mount_rest)
        self.docs = {p: (doc, default) for p, doc, default in field_docs()}
        self.problems: list[Problem] = []
        self.gpus: list[dict[str, Any]] | None = None
        self.plan: dict[str, Any] | None = None
        self.sweep: dict[str, Any] | None = None  # the what-if table for the current plan
        self.preflight: list[Problem] | None = None
        self.plan_complete = False  # estimate, sweep and preflight of the current spec are all shown
        self._keys: dict[str, str] = {}  # pane -> spec key its content was computed for
        self._debounce: dict[str, Timer] = {}
        self.launching = False
        self.launch_queued = False  # ^l pressed while the plan or preflight was still being checked
        self.data_problems: list[Problem] = []  # what the Dataset step's preview found wrong, for the current spec

    # -- layout ------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Horizontal(id="wizard-body"):
            yield StepList(*[Option(self._step_prompt(i, s, label), id=s) for i, (s, label) in enumerate(STEPS)],
                           id="steps")
            with Vertical(id="wizard-main"):
                with ContentSwitcher(initial=f"pane-{self.step}", id="panes"):
                    # Only the first step's pane is filled before the first frame; the rest follow right after it
                    # (see _mount_rest): a few hundred widgets fewer to build and style before anything shows.
                    for step in STEP_IDS:
                        with VerticalScroll(id=f"pane-{step}", classes="pane"):
                            if step == self.step:
                                yield from self._pane(step)
                with Horizontal(id="wizard-nav"):
                    yield Button("◀ Back ^p", id="back", compact=True)
                    yield Static("", id="problems")
                    yield Button("Next ^n ▶", id="next", compact=True)
        yield Static(HELP_HINT, id="help", markup=False)
        yield Footer()

    def _pane(self, step: str) -> list[Widget]:
        """The widgets of one step's pane."""
        title = Static(dict(STEPS)[step], classes="pane-title")
        if step == "model":
            return [title, *self._fields("model"), Static("", id="arch", classes="info")]
        if step == "dataset":
            return [title, *self._fields("dataset"), Static("", id="data-detect", classes="info"),
                    Static("", id="data-preview", classes="preview"), Static("", id="data-packing", classes="info")]
        if step == "hardware":
            return [title, Static("detecting GPUs…", id="gpus-detected", classes="info"), *self._fields("hardware"),
                    Static("", id="hw-summary", classes="info")]
        if step == "method":
            return [title, *self._fields("method")]
        if step == "plan":
            return [title, Static("computing the plan…", id="plan-verdict"), MemoryBar(id="plan-bar"),
                    Static("", id="plan-time", classes="info"), Static("", id="plan-suggestion"),
                    Static("what-if: GiB needed per GPU by tokens per block × GPU type", id="sweep-title",
                           classes="section"),
                    Static("", id="sweep"),
                    Static("", id="plan-preflight", classes="info"),
                    Static("command", classes="section"), Static("", id="plan-commands", classes="command",
                                                                 markup=False)]
        return [title, *self._fields("launch"), Static("", id="launch-summary", classes="info"),
                Horizontal(Button("Launch ^l", id="launch", variant="success", compact=True),
                           Button("Save recipe ^s", id="save", compact=True),
                           Button("Load recipe ^o", id="load", compact=True), id="launch-buttons")]

    async def _mount_rest(self) -> None:
        for step in STEP_IDS:
            if step != self.first_step:
                await self.query_one(f"#pane-{step}", VerticalScroll).mount_all(self._pane(step))
        self.ready = True
        self.revalidate()
        self._show_lora()
        # Background work starts after the first frame: its threads would hold the GIL while it is drawn.
        self.detect_gpus()
        self._on_step_shown()
        self.focus_step()

    def _fields(self, step: str) -> list[SpecField]:
        out = []
        for path, label, kind in FIELDS[step]:
            doc, default = self.docs.get(path, ("", None))
            options: list[Any] | None = None
            if kind == "select":
                options = ["auto", *self.app.backends.gpu_types()] if path == "hardware.gpu" else literal_options(path)
            choices = field_choices(path) if kind != "select" else []
            hint = f"; one of {', '.join(map(str, choices))}" if choices else ""
            # One paragraph: the schema's line breaks are for `runner fields`, the help line wraps by itself.
            field = SpecField(path, label, get_path(self.data, path), kind,
                              doc=" ".join(f"{path} (default {default!r}{hint}): {doc}".split()), options=options)
            if path in LORA_FIELDS:
                field.add_class("lora-only")
            out.append(field)
        return out

    @staticmethod
    def _step_prompt(i: int, step: str, label: str, bad: int = 0) -> Content:
        mark = Content(f" ✗{bad}").stylize("$text-error") if bad else Content("")
        return Content(f"{i + 1} {label}") + mark

    def on_mount(self) -> None:
        self.sub_title = f"recipe {self.recipe}" if self.recipe else "new run"
        self.query_one("#help", Static).update(STEP_HELP.get(self.step, HELP_HINT))
        steps = self.query_one("#steps", OptionList)
        with steps.prevent(OptionList.OptionHighlighted):
            steps.highlighted = STEP_IDS.index(self.step)
        self.revalidate()
        self._show_lora()
        self.call_after_refresh(self._mount_rest)

    # -- navigation --------------------------------------------------------------------------------

    def go(self, step: str, focus: bool = False) -> None:
        """Show `step`; with `focus`, the keyboard moves there too (its first field, or the pane to scroll)."""
        if step not in STEP_IDS:
            return
        self.step = step
        self.query_one("#panes", ContentSwitcher).current = f"pane-{step}"
        steps = self.query_one("#steps", OptionList)
        if steps.highlighted != STEP_IDS.index(step):
            # Set quietly: an echoed OptionHighlighted arriving after a newer change would switch back.
            with steps.prevent(OptionList.OptionHighlighted):
                steps.highlighted = STEP_IDS.index(step)
        self.query_one("#back", Button).disabled = step == STEP_IDS[0]
        self.query_one("#next", Button).disabled = step == STEP_IDS[-1]
        self.query_one("#help", Static).update(STEP_HELP.get(step, HELP_HINT))
        self._on_step_shown()
        if focus:
            self.focus_step()

    def focus_step(self) -> None:
        """Focus the shown step's first field (its meaning then shows on the help line), or its pane."""
        if not self.ready:
            return
        pane = self.query_one(f"#pane-{self.step}", VerticalScroll)
        for field in pane.query(SpecField):
            if field.display:
                field.control.focus()
                return
        pane.focus()

    def scroll_pane(self, how: str) -> None:
        pane = self.query_one(f"#pane-{self.step}", VerticalScroll)
        {"home": pane.scroll_home, "end": pane.scroll_end, "page_up": pane.scroll_page_up,
         "page_down": pane.scroll_page_down}[how](animate=False)

    def action_next_step(self) -> None:
        i = STEP_IDS.index(self.step)
        self.go(STEP_IDS[min(i + 1, len(STEP_IDS) - 1)], focus=True)

    def action_prev_step(self) -> None:
        i = STEP_IDS.index(self.step)
        self.go(STEP_IDS[max(i - 1, 0)], focus=True)

    @on(OptionList.OptionHighlighted, "#steps")
    def _step_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        # A queued event older than the list's current highlight (the list highlights its first option when it
        # gets focus on mount) must not switch steps back.
        if event.option_index != event.option_list.highlighted:
            return
        if event.option.id and event.option.id != self.step:
            self.go(event.option.id)

    @on(Button.Pressed, "#next")
    def _next_pressed(self) -> None:
        self.action_next_step()

    @on(Button.Pressed, "#back")
    def _back_pressed(self) -> None:
        self.action_prev_step()

    def _on_step_shown(self) -> None:
        if not self.ready:
            return
        if self.step == "model":
            self._schedule("arch", 0)
        elif self.step == "dataset":
            self._schedule("data", 0)
        elif self.step in ("plan", "launch"):
            self._schedule("plan", 0)
        self._update_hardware()
        self._update_launch()

    # -- editing and validation --------------------------------------------------------------------

    def on_spec_field_changed(self, event: SpecField.Changed) -> None:
        if get_path(self.data, event.path) == event.value:
            return
        set_path(self.data, event.path, event.value)
        self.revalidate()
        if event.path == "method.kind":
            self._show_lora()
        if event.path.startswith(ARCH_INPUTS) and self.step == "model":
            self._schedule("arch")
        if event.path.startswith(DATA_INPUTS) and self.step == "dataset":
            self._schedule("data")
        if self.step in ("plan", "launch"):
            self._schedule("plan")
        self._update_hardware()
        self._update_launch()

    def on_spec_field_focused(self, event: SpecField.Focused) -> None:
        self.query_one("#help", Static).update(event.doc)

    def _show_lora(self) -> None:
        lora = get_path(self.data, "method.kind") == "lora"
        for field in self.query(".lora-only"):
            field.display = lora

    def revalidate(self) -> None:
        self.problems = problems_of(self.data)
        self._show_blockers()

    def blockers(self) -> list[Problem]:
        """Everything that keeps Launch off: field problems, what the dataset preview and preflight found, a plan
        that could not be made. (A run predicted not to fit is not one: the launch asks to force it.)"""
        out = list(self.problems)
        # What the plan, preview and preflight found holds for the inputs they checked; after an edit elsewhere it
        # is stale until checked again (on the Dataset step, the Plan, or by ^l).
        planned = self._keys.get("plan") == spec_key(self.data)
        if planned and self.plan and self.plan.get("error") and not self.problems:
            out.append(Problem("", self.plan["error"]))
        if self.data_problems and self._keys.get("data") == spec_key(self.data, DATA_INPUTS):
            out += self.data_problems
        if planned:
            out += [p for p in self.preflight or [] if p not in out]
        return out

    def _show_blockers(self) -> None:
        blockers = self.blockers()
        # Each problem shows next to its field; those of fields the wizard does not show stay in the problem bar
        # and the Launch step's list.
        by_field: dict[str, list[Problem]] = {p: [] for p in ALL_FIELDS}
        for problem in blockers:
            f = field_of(problem.field, ALL_FIELDS) if problem.field else None
            if f:
                by_field[f].append(problem)
        for field in self.query(SpecField):
            field.set_problems(by_field.get(field.path, []))
        bad_per_step = dict.fromkeys(STEP_IDS, 0)
        for problem in blockers:
            f = field_of(problem.field, ALL_FIELDS) if problem.field else None
            section = (problem.field or "").split(".")[0]
            # A field the wizard does not show counts on the step of its section (dataset.format on Dataset).
            bad_per_step[STEP_OF_FIELD[f] if f else STEP_OF_SECTION.get(section, "plan")] += 1
        steps = self.query_one("#steps", OptionList)
        for i, (s, label) in enumerate(STEPS):
            steps.replace_option_prompt_at_index(i, self._step_prompt(i, s, label, bad_per_step[s]))
        bar = self.query_one("#problems", Static)
        if not blockers:
            checking = self.step in ("plan", "launch") and not self.plan_complete
            bar.update(Content("checking the plan…").stylize("$text-muted") if checking else
                       Content("✓ spec is valid").stylize("$text-success"))
        else:
            n = len(blockers)
            bar.update(Content(f"✗ {n} problem{'s' if n != 1 else ''}: {blockers[0]}").stylize("$text-error"))
        if self.ready:
            self._update_launch()

    # -- background work ---------------------------------------------------------------------------

    def _schedule(self, what: str, delay_s: float = DEBOUNCE_S) -> None:
        timer = self._debounce.pop(what, None)
        if timer is not None:
            timer.stop()
        self._debounce[what] = self.set_timer(max(delay_s, 0.01), lambda: self._start(what))

    def _start(self, what: str) -> None:
        self._debounce.pop(what, None)
        if what == "arch":
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

    def on_wizard_screen_gpus_ready(self, message: GpusReady) -> None:
        # The plan needs no recomputing: its worker asks the app for the same (cached) detection.
        self.gpus = message.gpus
        self._update_hardware()
        self._update_launch()

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

    def on_wizard_screen_arch_ready(self, message: ArchReady) -> None:
        if message.key != self._keys.get("arch"):
            return
        widget = self.query_one("#arch", Static)
        if message.error:
            widget.update(Content(f"architecture: {message.error}").stylize("$text-muted"))
            return
        widget.update(render_arch(message.arch or {}))

    @work(thread=True, exclusive=True, exit_on_error=False, group="data")
    def load_preview(self, data: dict[str, Any], key: str) -> None:
        from runner.plan.hub import hub_problems
        from tui.preview import tokenizer_preview

        spec = None
        try:
            spec = validate(data)
            unreachable = hub_problems(spec)
            if unreachable:  # said in seconds, not after the hub client's retries
                self.post_message(self.DataReady(key, None, "; ".join(map(str, unreachable)), unreachable))
                return
            preview = tokenizer_preview(spec)
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
            resolved, _ = plan_resolve(spec, len(self.app.detected_gpus()))
            problems = self.app.backends.preflight(resolved)
        except Exception:  # noqa: BLE001 - then the preview's own error is shown
            return []
        return [p for p in problems if p.field.startswith(("dataset", "model"))]

    def on_wizard_screen_data_ready(self, message: DataReady) -> None:
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
            resolved, planned = plan_resolve(spec, len(gpus))
        except UserError as e:
            self.post_message(self.PlanReady(key, {"error": str(e)}))
            return
        plan.update(spec=resolved, planned=planned)
        try:
            plan["estimate"] = self.app.backends.estimate(resolved)
        except EstimatorUnavailable as e:
            plan["estimate_error"] = str(e)
        except UserError as e:
            plan["estimate_error"] = str(e)
        except Exception as e:  # noqa: BLE001
            plan["estimate_error"] = f"the estimator failed: {type(e).__name__}: {e}"
        try:
            from runner.launch.command import build_command, command_line

            plan["commands"] = [command_line(build_command(resolved, Path("runs/<id>/spec.json"), "<id>", n))
                                for n in range(resolved.hardware.nodes)]
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
        return self.PreflightReady(key, problems, None)

    def on_wizard_screen_preflight_ready(self, message: PreflightReady) -> None:
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
        target = resolved
        if resolved.hardware.device == "cpu":
            # The what-if is about GPUs: the same run on as many GPUs per node as it has ranks.
            d = resolved.to_dict()
            d["hardware"]["device"] = "cuda"
            if spec.model.dtype == "auto":
                d["model"]["dtype"] = weights_dtype(spec, "cuda")
            d["train"]["optimizer_precision"] = optimizer_precision(spec.engine, spec.train.optimizer_precision,
                                                                    d["model"]["dtype"])
            target = RunSpec.model_validate(d)
        try:
            rows = self.app.backends.sweep(target, axes)
        except Exception as e:  # noqa: BLE001 - EstimatorUnavailable, UserError or a bug: shown in the table title
            return {"error": str(e) if isinstance(e, (UserError, EstimatorUnavailable)) else
                    f"{type(e).__name__}: {e}"}
        return {"axes": axes, "grid": sweep_grid(rows, axes), "ranks": target.hardware.nproc_per_node}

    def on_wizard_screen_plan_ready(self, message: PlanReady) -> None:
        if message.key != self._keys.get("plan"):
            return
        self.plan = message.plan
        render_plan(self, message.plan)
        if message.plan.get("error"):
            self.plan_complete = True
            self._queued_launch()
        self._show_blockers()

    def on_wizard_screen_sweep_ready(self, message: SweepReady) -> None:
        if message.key != self._keys.get("plan"):
            return
        self.sweep = message.sweep
        render_sweep(self, message.sweep, self.plan or {})

    # -- hardware and launch panes -----------------------------------------------------------------

    def _update_hardware(self) -> None:
        if not self.ready:
            return
        detected = self.query_one("#gpus-detected", Static)
        if self.gpus is None:
            detected.update(Content("detecting GPUs…").stylize("$text-muted"))
        elif not self.gpus:
            detected.update(Content.from_markup(
                "[b]no GPU detected[/b]: runs here use CPU ranks (gloo). To plan a GPU run, set device to [b]cuda[/b] "
                "and pick a GPU type; save the recipe and launch it where those GPUs are."))
        else:
            names = {}
            for g in self.gpus:
                names[g.get("name")] = names.get(g.get("name"), 0) + 1
            listing = ", ".join(f"{n} × {name} ({fmt.gib(self.gpus[0].get('mem_total_gib'))} GiB)"
                                for name, n in names.items())
            detected.update(Content(f"detected: {listing}"))
        h = self.data.get("hardware") or {}
        nodes, nproc, device = h.get("nodes"), h.get("nproc_per_node"), h.get("device")
        gpu = h.get("gpu")
        what = gpu if device != "cpu" and gpu != "auto" else ("CPU ranks" if device == "cpu" else "GPUs (detected)")
        text = f"plan: {nodes} node{'s' if nodes != 1 else ''} × {nproc} ranks per node of {what}"
        if isinstance(nodes, int) and isinstance(nproc, int):
            text += f" = {nodes * nproc} ranks"
        self.query_one("#hw-summary", Static).update(text)

    def _update_launch(self) -> None:
        if not self.ready:
            return
        button = self.query_one("#launch", Button)
        summary = self.query_one("#launch-summary", Static)
        app = self.app
        planned = bool(self.plan and self.plan.get("planned"))
        blockers = self.blockers()
        lines = []
        if blockers:
            lines.append(Content(f"✗ {len(blockers)} problem(s) to fix before launch:").stylize("$text-error"))
            lines += [Content(f"  {p}") for p in blockers[:6]]
        elif not self.plan_complete:
            lines.append(Content("checking the plan and preflight (data, template, packing, kernels)…")
                         .stylize("$text-muted"))
        elif planned:
            lines.append(Content("planned target: this machine has no GPU for it. Save the recipe (^s) and run "
                                 "`runner run <file>` or `sft-tui --headless --recipe <file>` there.")
                         .stylize("$text-warning"))
        else:
            spec = (self.plan or {}).get("spec")
            if spec is not None:
                lines.append(Content(f"ready: {spec.world_size} rank(s) on {spec.hardware.device}, "
                                     f"{spec.hardware.nodes} node(s)"))
                if spec.hardware.nodes > 1:
                    lines.append(Content("this node is node 0; start the other nodes with the commands on the Plan "
                                         "step"))
        lines.append(Content(f"runs → {fmt.show_path(app.runs_dir)}   records → {fmt.show_path(app.records_dir)}")
                     .stylize("$text-muted"))
        summary.update(Content("\n").join(lines))
        button.disabled = bool(blockers) or planned or self.launching

    # -- actions -----------------------------------------------------------------------------------

    @on(Button.Pressed, "#launch")
    def _launch_pressed(self) -> None:
        self.action_launch()

    @on(Button.Pressed, "#save")
    def _save_pressed(self) -> None:
        self.action_save_recipe()

    @on(Button.Pressed, "#load")
    def _load_pressed(self) -> None:
        self.action_load_recipe()

    def action_launch(self) -> None:
        blockers = self.blockers()
        if blockers:
            first = field_of(blockers[0].field, ALL_FIELDS) if blockers[0].field else None
            self.notify(f"fix {len(blockers)} problem(s) first: {blockers[0]}", title="Cannot launch",
                        severity="error")
            if first and blockers[0] in self.problems:
                self.go(STEP_OF_FIELD.get(first, self.step), focus=True)
            return
        if self._keys.get("plan") != spec_key(self.data) or not self.plan_complete:
            # Launch only what preflight has passed: check first, then launch if nothing is found.
            self.launch_queued = True
            self._schedule("plan", 0)
            self.notify("checking the plan and preflight first; the run starts when they pass", timeout=4)
            return
        if self.plan and self.plan.get("planned"):
            self.notify("this spec plans GPUs this machine does not have: save it and launch it there",
                        title="Cannot launch here", severity="warning")
            return
        if self.launching:
            return
        self.launching = True
        self._update_launch()
        self.app.start_run(validate(self.data), on_done=self._launch_done)

    def _launch_done(self) -> None:
        self.launching = False
        self._update_launch()

    def _queued_launch(self) -> None:
        if self.launch_queued and self.plan_complete:
            self.launch_queued = False
            self.action_launch()

    def action_save_recipe(self) -> None:
        from tui.screens.modals import SaveRecipePrompt

        if self.problems:
            self.notify(f"the spec has {len(self.problems)} problem(s): fix them before saving", severity="error",
                        title="Not saved")
            return
        name, description = self.proposed_name()

        def done(answer: dict[str, str] | None) -> None:
            if not answer:
                return
            from tui.specform import save_recipe

            for path, value in (("name", answer["name"] or name), ("description", answer["description"])):
                set_path(self.data, path, value)
                for field in self.query(SpecField):
                    if field.path == path:
                        field.set_value(value)
            try:
                saved = save_recipe(self.data, Path(answer["path"]).expanduser())
            except (UserError, OSError) as e:
                self.notify(str(e), title="Not saved", severity="error")
                return
            self.revalidate()
            self.notify(f"saved {fmt.show_path(saved)}: run it with `runner run {fmt.show_path(saved)}`",
                        title="Recipe saved")

        self.app.push_screen(SaveRecipePrompt(name, description, proposed_path(name)), done)

    def proposed_name(self) -> tuple[str, str]:
        """The run name and description to save under: the recipe's own while its model, data and method are the
        ones it came with; otherwise a name and a line that say what the choices now are."""
        name, description = self.data.get("name") or "run", self.data.get("description") or ""
        changed = any(spec_key(self.data, (p,)) != spec_key(self.origin, (p,))
                      for p in ("model.", "dataset.", "method.", "engine"))
        if not changed or name != (self.origin.get("name") or "run"):
            return name, description
        model = str(get_path(self.data, "model.id") or get_path(self.data, "model.path") or "model")
        kind = get_path(self.data, "method.kind") or "full"
        slug = re.sub(r"[^a-z0-9.]+", "-", model.rsplit("/", 1)[-1].lower()).strip("-") or "model"
        data_name = get_path(self.data, "dataset.id") or Path(str(get_path(self.data, "dataset.path") or "")).name
        if description == (self.origin.get("description") or ""):
            description = f"{kind} fine-tune of {model} on {data_name or 'the dataset'}"
        return f"{slug}-{kind}", description

    def action_load_recipe(self) -> None:
        from runner.spec import recipe_names
        from tui.screens.modals import PathPrompt

        def done(ref: str | None) -> None:
            if not ref:
                return
            from tui.specform import load_recipe_dict

            try:
                data = load_recipe_dict(ref)
            except UserError as e:
                self.notify(str(e), title="Not loaded", severity="error")
                return
            self.load_data(data, recipe=ref)
            self.notify(f"loaded {ref}", title="Recipe loaded")

        self.app.push_screen(PathPrompt("Load a recipe (name or YAML path):", "", choices=recipe_names(),
                                        action="Load"), done)

    def load_data(self, data: dict[str, Any], recipe: str | None = None) -> None:
        self.data = data
        self.origin = copy.deepcopy(data)
        if recipe:
            self.recipe = recipe
            self.sub_title = f"recipe {recipe}"
        for field in self.query(SpecField):
            field.set_value(get_path(data, field.path))
        self._keys.clear()
        self.plan = None
        self.revalidate()
        self._show_lora()
        self._on_step_shown()


def proposed_path(name: str) -> str:
    """Where Ctrl+S proposes to save: recipes/ when it is here (then `runner run <name>` finds it), never over an
    existing file."""
    folder = Path("recipes") if Path("recipes").is_dir() else Path(".")
    path, n = folder / f"{name}.yaml", 2
    while path.exists():
        path, n = folder / f"{name}-{n}.yaml", n + 1
    return str(path)


# -- renderers (pure: dict in, Content out) ----------------------------------------------------------


def render_arch(arch: dict[str, Any]) -> Content:
    rows: list[tuple[str, str]] = []
    label = {"model_type": "type", "params_total": "parameters", "params_active": "active parameters",
             "layers": "layers", "num_hidden_layers": "layers", "layer_types": "layer types", "vocab": "vocab",
             "vocab_size": "vocab", "hidden": "hidden size", "hidden_size": "hidden size", "experts": "experts",
             "source": "config from", "approximate": "approximate"}
    seen = set()
    for key, name in label.items():
        if key in arch and arch[key] is not None and name not in seen:
            seen.add(name)
            value = arch[key]
            if key.startswith("params"):
                text = fmt.count(value)
            elif isinstance(value, dict):
                text = ", ".join(f"{k} × {v}" for k, v in value.items())
            elif isinstance(value, (list, tuple)):
                counts: dict[str, int] = {}
                for v in value:
                    counts[str(v)] = counts.get(str(v), 0) + 1
                text = ", ".join(f"{k} × {v}" for k, v in counts.items())
            else:
                text = f"{value:,}" if isinstance(value, int) else str(value)
            rows.append((name, text))
    if not rows:
        return Content("architecture: no details").stylize("$text-muted")
    width = max(len(n) for n, _ in rows)
    lines = [Content("architecture").stylize("bold")]
    lines += [Content(f"  {n:<{width}}  ").stylize("$text-muted") + Content(v) for n, v in rows]
    return Content("\n").join(lines)


def render_detect(info: dict[str, Any]) -> Content:
    if "hub" in info:
        return Content(f"hub dataset {info['hub']}: the wizard reads local files only (no hub access); set a local "
                       "path to preview it").stylize("$text-muted")
    cols = ", ".join(info.get("columns") or []) or "none"
    ok = info.get("messages_ok")
    what = ("chat messages · " if info.get("chat") else "") + str(info.get("detected") or "")
    status = Content(f" ✓ {what}" if ok else f" ✗ {what}").stylize("$text-success" if ok else "$text-error")
    return Content(f"{info.get('format')} file {fmt.show_path(info.get('file'))} · columns: {cols}") + status


def render_tokens(p: dict[str, Any]) -> Content:
    trained, total = p.get("n_trained", 0), p.get("n_tokens", 0)
    head = Content("").join([
        Content("first conversation through the chat template: ").stylize("bold"),
        Content(f"{total} tokens, {trained} trained on ({100 * trained / max(total, 1):.0f}%) · "),
        Content("trained").stylize("bold $text-success"), Content(" / "),
        Content("context").stylize("$text-muted"),
        Content(f" · mask by {p.get('template')}"),
    ])
    parts = []
    for text, on_loss in p.get("tokens") or []:
        parts.append(Content(text).stylize("bold $text-success underline" if on_loss else "$text-muted"))
    body = Content("").join(parts)
    if p.get("truncated"):
        body = body + Content(" …").stylize("$text-muted")
    return Content("\n").join([head, body])


def render_packing(p: dict[str, Any]) -> Content:
    s = p["pack"]
    eff = s.get("packing_efficiency")
    share = s.get("target_share")
    return Content(
        f"packing ({p.get('strategy', 'wrapped')}) on a sample of {s.get('examples')} conversations into "
        f"{p.get('seq_len'):,}-token blocks: {s.get('blocks')} blocks, efficiency {100 * eff:.1f}%, trained-on "
        f"tokens {100 * share:.1f}% of the block, {s.get('split_documents')} conversations split across blocks, "
        f"{s.get('skipped_no_assistant')} "
        "skipped (no assistant turn)" if eff is not None else "packing: no tokens in the sample")


def render_plan(screen: WizardScreen, plan: dict[str, Any]) -> None:
    verdict_w = screen.query_one("#plan-verdict", Static)
    bar = screen.query_one("#plan-bar", MemoryBar)
    time_w = screen.query_one("#plan-time", Static)
    sugg_w = screen.query_one("#plan-suggestion", Static)
    cmd_w = screen.query_one("#plan-commands", Static)
    if plan.get("error"):
        verdict_w.update(Content(f"✗ {plan['error']}").stylize("$text-error"))
        bar.set_estimate({}, None, None)
        time_w.update("")
        sugg_w.update("")
        cmd_w.update("")
        return
    spec: RunSpec = plan["spec"]
    where = f"{spec.world_size} rank(s) on {spec.hardware.device}"
    if plan.get("planned"):
        where += " (planned target; this machine has no GPU)"
    est = plan.get("estimate")
    bar.display = est is not None
    if est is None:
        err = plan.get("estimate_error") or "no estimate"
        hint = " — pick a GPU type on the Hardware step to plan for one" if "hardware.gpu" in err else ""
        verdict_w.update(Content("\n").join([Content(where).stylize("$text-muted"),
                                             Content(err + hint).stylize("$text-warning")]))
        bar.set_estimate({}, None, None)
        time_w.update("")
        sugg_w.update("")
    else:
        verdict = est.get("verdict") or ("fits" if est.get("fits") else "does not fit")
        token = VERDICT_TOKEN.get(verdict, "warning")
        capacity = est.get("gpu_memory_gib")
        device_word = "host RAM" if spec.hardware.device == "cpu" else (est.get("gpu") or "GPU")
        line = Content("").join([
            Content(f" {verdict.upper()} ").stylize(f"bold $text-{token} on ${token}-muted"),
            Content(f"  {fmt.memory_estimate(est)} of {fmt.gib(capacity)} GiB {device_word}, "
                    f"headroom {fmt.gib(est.get('headroom_gib'))} GiB"),
            Content(" (approximate)").stylize("$text-warning") if est.get("approximate") else Content(""),
        ])
        lines = [Content(where).stylize("$text-muted"), line]
        if est.get("approximate") and est.get("approximate_reason"):
            lines.append(Content(f"approximate: {est['approximate_reason']}").stylize("$text-muted"))
        advice = precision_advice(spec)
        if advice:
            lines.append(Content(f"note: {advice}").stylize("$text-warning"))
        lines += [Content(f"warning: {w}").stylize("$text-warning") for w in spec_warnings(spec)]
        verdict_w.update(Content("\n").join(lines))
        bar.set_estimate(fmt.breakdown_parts(est), est.get("per_gpu_gib"), capacity, device_word)
        time_w.update(Content(f"time: {fmt.num(est.get('step_s'), '.3g')} s/step × {est.get('steps') or '?'} steps "
                              f"≈ {fmt.duration(est.get('total_s'))}"))
        suggestion = est.get("suggestion")
        if suggestion and verdict != "fits":
            sugg_w.update(Content(f"suggestion: {suggestion}").stylize("$text-warning"))
        else:
            sugg_w.update("")
    if plan.get("commands"):
        n = len(plan["commands"])
        cmd_w.update("\n".join(f"# node {i}\n{c}" if n > 1 else c for i, c in enumerate(plan["commands"])))
    else:
        cmd_w.update(f"command unavailable: {plan.get('command_error')}")


def render_sweep(screen: WizardScreen, sweep: dict[str, Any], plan: dict[str, Any]) -> None:
    """The what-if grid as text: a Static, so that it is laid out with the rest of the pane in the same frame."""
    grid_w = screen.query_one("#sweep", Static)
    title = screen.query_one("#sweep-title", Static)
    if sweep.get("error"):
        title.update(Content(f"what-if table unavailable: {sweep['error']}").stylize("$text-muted"))
        grid_w.display = False
        return
    grid_w.display = True
    (_, seq_lens), (_, gpu_types) = sweep["axes"]
    title.update(f"what-if: GiB needed per GPU, {sweep.get('ranks')} GPU(s) per node, by tokens per block × GPU type")
    spec: RunSpec | None = plan.get("spec")
    first_w = max(len("GPU"), *(len(g) for g in gpu_types)) + 2
    cell_w = 11
    head = [Content(f"{'GPU':<{first_w}}").stylize("bold")]
    for s in seq_lens:
        mark = " •" if spec is not None and spec.train.seq_len == s else ""
        head.append(Content(f"{f'{s:,}{mark}':>{cell_w}}").stylize("bold"))
    lines = [Content("").join(head)]
    for g in gpu_types:
        cells = [Content(f"{g:<{first_w}}")]
        for s in seq_lens:
            row = sweep["grid"].get((s, g))
            if row is None:
                cells.append(Content(f"{'-':>{cell_w}}"))
                continue
            verdict = row.get("verdict") or ("fits" if row.get("fits") else "does not fit")
            mark = {"fits": "✓", "tight": "~", "does not fit": "✗"}.get(verdict, "?")
            token = VERDICT_TOKEN.get(verdict, "warning")
            text = f"{fmt.gib(row.get('per_gpu_gib'))} {mark}"
            cells.append(Content(f"{text:>{cell_w}}").stylize(f"$text-{token}"))
        lines.append(Content("").join(cells))
    grid_w.update(Content("\n").join(lines))
