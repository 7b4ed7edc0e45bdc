"""The wizard's Launch step: what keeps Launch off, launching, and saving or loading the choices as a recipe."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from textual.content import Content
from textual.screen import Screen
from textual.widgets import Button, Static

from runner.errors import UserError
from runner.api import follow_run
from runner.spec import validate
from tui import format as fmt
from tui.screens.wizard.fields import ALL_FIELDS, STEP_OF_FIELD, spec_key
from tui.specform import field_of, get_path, set_path
from tui.widgets.fields import SpecField


class WizardLaunch(Screen):
    """Part of WizardScreen: the Launch pane and the launch, save and load actions."""

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
        # Whole, wrapped: the description's field shows only as much as its row holds.
        name, description = self.proposed_name()
        lines.append(Content("recorded as ").stylize("$text-muted") + Content(name).stylize("bold") +
                     Content(f": {description}" if description else ""))
        lines.append(Content(f"runs → {fmt.show_path(app.runs_dir)}   records → {fmt.show_path(app.records_dir)}")
                     .stylize("$text-muted"))
        summary.update(Content("\n").join(lines))
        button.disabled = bool(blockers) or planned or self.launching

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
        self.app.start_run(validate({**self.data, **dict(zip(("name", "description"), self.proposed_name()))}),
                           on_done=self._launch_done)

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
        """The run name and description to save or launch under (runner.naming's follow_run, as `runner run`)."""
        data = copy.deepcopy(self.data)
        follow_run(data, self.origin)
        return data.get("name") or "run", data.get("description") or ""

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
        self.named_ids.clear()  # the loaded recipe names its data afresh
        self.init_chosen = self.init_proposed = False
        self._schedule("weights", 0)
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
