"""The wizard: Model → Dataset → Hardware → Method → Plan → Launch over one spec dict, validated live."""

from __future__ import annotations

import copy
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Button, ContentSwitcher, Header, OptionList, Static
from textual.widgets.option_list import Option

from runner.errors import Problem
from runner.spec import field_choices, field_docs
from tui import format as fmt
from tui.screens.wizard.checks import WizardChecks
from tui.screens.wizard.fields import (ALL_FIELDS, ARCH_INPUTS, DATA_INPUTS, FIELDS, FOLLOWED_IDS, HELP_HINT,
                                       HELP_LINES, LORA_FIELDS, MAPPING_HINT, STEP_HELP, STEP_IDS, STEP_OF_FIELD,
                                       STEP_OF_SECTION, STEPS, fit_help, spec_key)
from tui.screens.wizard.launch import WizardLaunch
from tui.specform import field_of, get_path, problems_of, set_path
from tui.widgets.fields import SpecField
from tui.widgets.footer import KeyFooter
from tui.widgets.membar import MemoryBar


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


class WizardScreen(WizardLaunch, WizardChecks):
    """The spec being built lives in `self.data` (a full raw dict); every edit revalidates the whole of it."""

    BINDINGS = [
        Binding("ctrl+n", "next_step", "Next", priority=True),
        Binding("ctrl+p", "prev_step", "Back", priority=True),
        Binding("ctrl+l", "launch", "Launch", priority=True),
        Binding("ctrl+s", "save_recipe", "Save", priority=True),
        Binding("ctrl+o", "load_recipe", "Load", priority=True),
        Binding("f1", "full_help", "Field help", show=False),  # the help line names it when it cuts
        # Moved as the key arrives, as ^n moves it: a key goes to the widget focused when the app reads it, so keys
        # typed right after a Tab handled later by the field went to the field the Tab was leaving.
        Binding("tab", "app.focus_next", show=False, priority=True),
        Binding("shift+tab", "app.focus_previous", show=False, priority=True),
    ]

    def __init__(self, data: dict[str, Any], step: str = "model", recipe: str | None = None) -> None:
        super().__init__()
        self.data = data
        self.recipe = recipe  # the recipe the choices came from (title, and what Ctrl+S proposes)
        self.origin = copy.deepcopy(data)  # as loaded: Ctrl+S renames a recipe whose model or data changed
        self.step = step if step in STEP_IDS else "model"
        self.first_step = self.step
        self.ready = False  # every pane is mounted (see _mount_rest)
        self.docs = {p: (doc, default) for p, doc, default in field_docs()}
        self.named_ids: set[str] = set()  # ids typed here, which a new path then leaves alone
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
        self.full_help = ""  # the focused field's meaning, whole (F1), when the help line holds only its start
        self.init_chosen = False  # model.init was set here: a model folder's weights no longer decide it
        self.init_proposed = False  # model.init is random because the folder held no weights

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
        yield KeyFooter()

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
        self.app.warm_imports()
        self._schedule("weights", 0)
        self._on_step_shown()
        self.focus_step()

    def _fields(self, step: str) -> list[SpecField]:
        out = []
        for path, label, kind in FIELDS[step]:
            doc, default = self.docs.get(path, ("", None))
            options: list[Any] | None = None
            if kind == "select":
                options = ["auto", *self.app.backends.gpu_types()] if path == "hardware.gpu" else field_choices(path)
            choices = field_choices(path) if kind != "select" else []
            hint = f"; one of {', '.join(map(str, choices))}" if choices else MAPPING_HINT if kind == "mapping" else ""
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
        # set_focus now, not Widget.focus(): that posts the move behind the keys already queued, so a Tab and a path
        # typed right after ^n went to the new step's first field once the late move arrived.
        for field in pane.query(SpecField):
            if field.display:
                self.set_focus(field.control)
                return
        self.set_focus(pane)

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
        if event.path == "model.init":
            self.init_chosen = True
        self._edited(event.path, event.value)

    def set_field(self, path: str, value: Any) -> None:
        """Set a field for the user (shown in its widget), with what an edit of it sets off."""
        self.query_one("#f-" + path.replace(".", "-").replace("_", "-"), SpecField).set_value(value)
        self._edited(path, value)

    def _edited(self, path: str, value: Any) -> None:
        set_path(self.data, path, value)
        if path in FOLLOWED_IDS.values():
            self.named_ids.add(path)
        elif path in FOLLOWED_IDS:
            self._follow_path(path)
        if path == "model.path":
            self._schedule("weights")
        self.revalidate()
        if path == "method.kind":
            self._show_lora()
        if path.startswith(ARCH_INPUTS) and self.step == "model":
            self._schedule("arch")
        if path.startswith(DATA_INPUTS) and self.step == "dataset":
            self._schedule("data")
        if self.step in ("plan", "launch"):
            self._schedule("plan")
        self._update_hardware()
        self._update_launch()

    def _follow_path(self, path_field: str) -> None:
        """A new local path renames the model or data after it (local/<name>), unless its id was typed here:
        the id is what `runner list`, the records and the pins show, and the recipe's would name every run alike."""
        from runner.api import path_name

        id_field, path = FOLLOWED_IDS[path_field], get_path(self.data, path_field)
        if id_field in self.named_ids or not path or str(path).startswith("embedded:"):
            return
        new = path_name(str(path))
        if get_path(self.data, id_field) == new:
            return
        set_path(self.data, id_field, new)
        self.query_one("#f-" + id_field.replace(".", "-").replace("_", "-"), SpecField).set_value(new)
        # Said on the help line, which each keystroke of the path rewrites (a toast per keystroke would pile up).
        self.query_one("#help", Static).update(f"{id_field} is now {new}, named after {path_field} (the recipe's "
                                               f"was {self.origin_id(id_field)}); type an id to name it otherwise")

    def origin_id(self, id_field: str) -> Any:
        return get_path(self.origin, id_field)

    def on_spec_field_focused(self, event: SpecField.Focused) -> None:
        focused = self.focused
        field = next((w for w in focused.ancestors_with_self if isinstance(w, SpecField)), None) if focused else None
        if field is None or field.path != event.path:
            return  # a field the focus has already left (a Tab typed right after ^n): its meaning is not wanted
        self.full_help = event.doc
        help_w = self.query_one("#help", Static)
        help_w.update(fit_help(event.doc, (help_w.size.width or self.app.size.width) - 2, HELP_LINES))

    def action_full_help(self) -> None:
        from tui.screens.modals import TextScreen

        if self.full_help:
            self.app.push_screen(TextScreen("the focused field", self.full_help))

    def _show_lora(self) -> None:
        lora = get_path(self.data, "method.kind") in ("lora", "qlora")
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

