"""The sft-tui app: `make_app(...)` builds it (tests inject folders, backends, a clock); `main()` is the command."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen

from runner import api
from runner.errors import PredictedNotToFit, UserError
from runner.spec import RunSpec
from tui.backends import Backends
from tui.specform import DEFAULT_RECIPE, full_dict, load_recipe_dict

START_SCREENS = ("wizard", "model", "dataset", "hardware", "method", "plan", "launch", "records", "dashboard",
                 "summary")


@dataclass
class Launched(Message):
    active: Any
    estimate: dict[str, Any] | None
    original: dict[str, Any] | None


@dataclass
class LaunchFailed(Message):
    message: str
    spec: RunSpec | None = None  # set when a forced launch may go ahead (predicted not to fit)
    original: dict[str, Any] | None = None


class SftApp(App):
    """Screens are pushed on one stack: wizard (or records) at the bottom, dashboard and summary above it."""

    CSS_PATH = "app.tcss"
    TITLE = "sft-tui"
    ENABLE_COMMAND_PALETTE = False  # ctrl+p is the wizard's Back
    BINDINGS = [
        Binding("ctrl+r", "records", "Records"),
        Binding("ctrl+t", "toggle_theme", "Light/dark", show=False),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, runs_dir: Path, records_dir: Path, initial_data: dict[str, Any], start_screen: str = "wizard",
                 run_dir: Path | None = None, record_path: Path | None = None, backends: Backends | None = None,
                 clock: Callable[[], float] = time.time, poll_s: float = 0.5, recipe: str | None = None) -> None:
        super().__init__()
        self.recipe = recipe  # the recipe the first wizard starts from (its title says so)
        if start_screen not in START_SCREENS:
            raise ValueError(f"start_screen must be one of {', '.join(START_SCREENS)}, got {start_screen!r}")
        self.runs_dir = Path(runs_dir)
        self.records_dir = Path(records_dir)
        self.initial_data = initial_data
        self.start_screen = start_screen
        self.run_dir = run_dir
        self.record_path = record_path
        self.backends = backends or Backends()
        self.clock = clock
        self.poll_s = poll_s
        self.quitting = False
        self._gpus: list[dict[str, Any]] | None = None
        self._gpus_lock = threading.Lock()
        self._launch_done: Callable[[], None] | None = None
        self._warming = False

    def on_mount(self) -> None:
        self.push_screen(self._first_screen())
        # After the first frame: the worker's thread (it imports the supervisor's modules) would hold the GIL
        # while the first screen is drawn.
        self.call_after_refresh(self._note_live_runs)

    @work(thread=True, exit_on_error=False, group="live-runs")
    def _note_live_runs(self) -> None:
        """Runs still going (started by another wizard or `runner run`) are named at start; Ctrl+R opens them."""
        live = api.live_runs(self.records_dir)
        if live:
            ids = ", ".join(r["id"] for r in live[:3]) + ("…" if len(live) > 3 else "")
            self.call_from_thread(self.notify, f"{len(live)} run(s) going: {ids}; Ctrl+R, then Enter, opens the "
                                  "live dashboard", title="Running", timeout=10)

    def warm_imports(self) -> None:
        """Once, after the wizard's first screen: torch and transformers (seconds to import on 2 cores) load in a
        worker, so that the checks which need them start at once; none of them is imported before the first
        paint."""
        if not self._warming:
            self._warming = True
            self._warm_imports()

    @work(thread=True, exit_on_error=False, group="warm-imports")
    def _warm_imports(self) -> None:
        api.warm_imports()  # transformers' names under the lock the other workers' lookups take

    def _first_screen(self) -> Screen:
        from tui.screens.wizard import WizardScreen

        s = self.start_screen
        if s == "records":
            from tui.screens.records import RecordsScreen

            return RecordsScreen(self.records_dir)
        if s == "dashboard":
            from tui.screens.dashboard import DashboardScreen

            if self.run_dir is None:
                raise ValueError("start_screen='dashboard' needs run_dir")
            try:  # the run's record, when it is in our records folder, holds what was predicted
                estimate = api.load_record(self.records_dir / f"{Path(self.run_dir).name}.json").get("estimate")
            except api.RecordError:
                estimate = None
            return DashboardScreen(self.run_dir, estimate=estimate, clock=self.clock, poll_s=self.poll_s)
        if s == "summary":
            from tui.screens.summary import SummaryScreen

            if self.record_path is None:
                raise ValueError("start_screen='summary' needs record_path")
            return SummaryScreen(api.load_record(self.record_path), self.record_path)
        return WizardScreen(self.initial_data, "model" if s == "wizard" else s, recipe=self.recipe)

    # -- machine facts (thread-safe: workers call these) -------------------------------------------

    def detected_gpus(self) -> list[dict[str, Any]]:
        with self._gpus_lock:
            if self._gpus is None:
                try:
                    self._gpus = self.backends.detect_gpus()
                except Exception:  # noqa: BLE001 - no NVML is the same as no GPU for planning
                    self._gpus = []
            return self._gpus

    # -- launching ---------------------------------------------------------------------------------

    def start_run(self, spec: RunSpec, original: dict[str, Any] | None = None, force: bool = False,
                  on_done: Callable[[], None] | None = None) -> None:
        """Launch `spec` (or replay `original`) in a worker; the dashboard opens when torchrun is started."""
        self._launch_done = on_done
        self.notify("starting torchrun…" if original is None else f"replaying {original['id']}…", timeout=4)
        self._launch(spec, original, force)

    @work(thread=True, exclusive=True, exit_on_error=False, group="launch")
    def _launch(self, spec: RunSpec, original: dict[str, Any] | None, force: bool) -> None:
        try:
            resolved, planned = api.resolve_for(spec, self.detected_gpus())
            if planned:
                raise UserError("this spec plans GPUs this machine does not have: save it and launch it there")
            if original is not None:
                estimate = original.get("estimate")
            else:
                try:
                    # The same preflight as `runner run`: refuses a run predicted not to fit (memory, disk) unless forced.
                    # Any other problem (data, template, kernels) is not forceable: it goes to the outer handler.
                    estimate = api.gate(resolved, force, runs_dir=self.runs_dir).estimate
                except PredictedNotToFit as e:
                    self.post_message(LaunchFailed(e.reason, spec=spec))  # the dialog asks "Launch anyway?" itself
                    return
                except UserError:
                    raise
                except Exception:  # noqa: BLE001 - a broken estimator must not block launching
                    estimate = None
            # The run's own supervisor, apart from this terminal: closing the wizard never stops or orphans it.
            active = api.launch(resolved, self.runs_dir, self.records_dir, estimate=estimate,
                                replay_of=original["id"] if original else None,
                                decisions=api.recorded_decisions(original) if original else None)
        except UserError as e:
            self.post_message(LaunchFailed(str(e)))
            return
        except Exception as e:  # noqa: BLE001
            self.post_message(LaunchFailed(f"{type(e).__name__}: {e}"))
            return
        self.post_message(Launched(active, estimate, original))

    def on_launched(self, message: Launched) -> None:
        from tui.screens.dashboard import DashboardScreen

        self._call_launch_done()
        self.push_screen(DashboardScreen(message.active.paths.run_dir, active=message.active,
                                         estimate=message.estimate, clock=self.clock, poll_s=self.poll_s,
                                         original=message.original))

    def on_launch_failed(self, message: LaunchFailed) -> None:
        from tui.screens.modals import ConfirmScreen

        self._call_launch_done()
        if message.spec is None:
            self.notify(message.message, title="Not launched", severity="error", timeout=20)
            return
        spec = message.spec

        def answer(yes: bool | None) -> None:
            if yes:
                self.start_run(spec, force=True)

        self.push_screen(ConfirmScreen(f"{message.message}\n\nLaunch anyway?", yes="Launch anyway", no="Back",
                                       danger=True), answer)

    def _call_launch_done(self) -> None:
        done, self._launch_done = self._launch_done, None
        if done is not None:
            done()

    # -- navigation --------------------------------------------------------------------------------

    def show_summary(self, record: dict[str, Any], path: Path | None, replay: dict[str, Any] | None = None) -> None:
        from tui.screens.summary import SummaryScreen

        if self.quitting:
            self.exit()
            return
        self.push_screen(SummaryScreen(record, path, replay))

    def back_from(self, screen: Screen) -> None:
        """Escape: back to the screen below, never past the first one."""
        if len(self.screen_stack) > 2 and self.screen is screen:
            self.pop_screen()

    def action_records(self) -> None:
        from tui.screens.records import RecordsScreen

        if isinstance(self.screen, RecordsScreen):
            self.screen.action_reload()
            return
        self.push_screen(RecordsScreen(self.records_dir))

    def action_new_run(self) -> None:
        """Back to the wizard at the bottom of the stack (or a fresh one) to set up the next run."""
        from tui.screens.wizard import WizardScreen

        if self._live_dashboards():
            self.notify("a run is still going", severity="warning")
            return
        while len(self.screen_stack) > 2 and not isinstance(self.screen, WizardScreen):
            self.pop_screen()
        if not isinstance(self.screen, WizardScreen):
            self.push_screen(WizardScreen(full_dict(self.initial_data)))

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.theme == "textual-dark" else "textual-dark"

    def _live_dashboards(self) -> list[Any]:
        from tui.screens.dashboard import DashboardScreen

        return [s for s in self.screen_stack if isinstance(s, DashboardScreen) and s.active is not None and not s.attached
                and s.record is None]

    async def action_quit(self) -> None:
        from tui.screens.modals import QuitDuringRunScreen

        live = self._live_dashboards()
        if not live:
            self.exit()
            return
        if self.quitting:
            return

        def answer(choice: str | None) -> None:
            if choice == "leave":
                # The supervisor owns the run, apart from this terminal: quitting the view leaves it going.
                ids = ", ".join(d.run_id for d in live)
                self.exit(message=f"left running: {ids}; follow with `runner attach {live[0].run_id}`, "
                                  f"cancel with `runner attach {live[0].run_id} --cancel`")
                return
            if choice != "cancel":
                return
            self.quitting = True
            for dash in live:
                if not dash.ending:
                    dash.ending = True
                    dash.end_run(cancel=True)
            self.notify("cancelling the run before quitting…", timeout=30)

        self.push_screen(QuitDuringRunScreen(), answer)


def make_app(runs_dir: Path | str = "runs", records_dir: Path | str = "records",
             initial_spec: RunSpec | dict[str, Any] | str | None = None, start_screen: str = "wizard",
             run_dir: Path | None = None, record_path: Path | None = None, backends: Backends | None = None,
             clock: Callable[[], float] = time.time, poll_s: float = 0.5, recipe: str | None = None) -> SftApp:
    """The app over these folders. initial_spec: a RunSpec, a raw spec dict, a recipe name/path, or None for the
    embedded default (tiny-cpu). start_screen: a wizard step ("wizard" = its first), "records", "dashboard"
    (of `run_dir`) or "summary" (of `record_path`). recipe: the name the wizard's title gives the choices (a recipe
    name or path given as initial_spec is its own)."""
    if isinstance(initial_spec, (str, Path)) and recipe is None:
        recipe = str(initial_spec)
    if initial_spec is None:
        data = load_recipe_dict(DEFAULT_RECIPE)
    elif isinstance(initial_spec, RunSpec):
        data = initial_spec.to_dict()
    elif isinstance(initial_spec, dict):
        data = full_dict(initial_spec)
    else:
        data = load_recipe_dict(initial_spec)
    return SftApp(Path(runs_dir), Path(records_dir), data, start_screen, run_dir=run_dir, record_path=record_path,
                  backends=backends, clock=clock, poll_s=poll_s, recipe=recipe)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sft-tui", description="Plan, launch and watch SFT runs in a terminal; browse and replay their records.",
        epilog="examples:\n  sft-tui                                  # wizard on the embedded default (tiny-cpu)\n"
               "  sft-tui --recipe tiny-cpu --set train.max_steps=20   # opens at the Plan step\n"
               "  sft-tui --headless --recipe tiny-cpu     # no UI: the same code path as `runner run`\n"
               "  sft-tui --records                        # records browser\n"
               "  sft-tui --watch runs/<id>                # dashboard of a run started elsewhere",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", metavar="NAME|PATH", help="recipe name or YAML/JSON spec file to load")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a spec field, e.g. --set train.lr=1e-4 (repeatable)")
    p.add_argument("--headless", action="store_true", help="no UI: launch and watch like `runner run`")
    p.add_argument("--json", action="store_true", help="headless: print one JSON object as the last line")
    p.add_argument("--plain", action="store_true", help="headless: plain progress lines even on a terminal")
    p.add_argument("--force", action="store_true", help="headless: launch even when predicted not to fit")
    p.add_argument("--records", action="store_true", help="open the records browser")
    p.add_argument("--watch", type=Path, metavar="RUN_DIR", help="open the dashboard of an existing run folder")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where run folders go (default: runs)")
    p.add_argument("--records-dir", type=Path, default=Path("records"), help="where records go (default: records)")
    return p


def headless_argv(args: argparse.Namespace) -> list[str]:
    """The `runner run` command line that `sft-tui --headless` becomes (run by this Python: the same installation)."""
    argv = [sys.executable, "-m", "runner", "run", args.recipe, "--runs-dir", str(args.runs_dir), "--records-dir",
            str(args.records_dir)]
    for assignment in args.overrides:
        argv += ["--set", assignment]
    return argv + [flag for flag, on in (("--json", args.json), ("--plain", args.plain), ("--force", args.force))
                   if on]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.headless:
        if not args.recipe:
            print("error: --headless needs --recipe NAME|PATH", file=sys.stderr)
            return 2
        # `runner run` itself, in this process's place: the same session, output, signals and exit codes.
        argv = headless_argv(args)
        os.execv(argv[0], argv)
    try:
        data = load_recipe_dict(args.recipe or DEFAULT_RECIPE, args.overrides)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.watch is not None:
        if not api.run_paths(args.watch).events.is_dir():
            print(f"error: --watch expects a run folder with an events/ folder, got {args.watch}", file=sys.stderr)
            return 2
        start = "dashboard"
    elif args.records:
        start = "records"
    else:
        start = "plan" if args.recipe else "wizard"
    app = make_app(args.runs_dir, args.records_dir, data, start, run_dir=args.watch, recipe=args.recipe)
    app.run()
    return app.return_code or 0


if __name__ == "__main__":
    sys.exit(main())
