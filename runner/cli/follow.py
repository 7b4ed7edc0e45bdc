"""The foreground view of a supervised run (`runner run`, `runner attach`): mirrors its events live and turns the
view's own signals into requests to the supervisor, as schedulers mean them.

SIGINT (Ctrl+C): cancel (with `ask`, on a terminal, a question first). SIGTERM: a graceful stop with a
checkpoint. SIGUSR1 (SLURM's warning before the time limit, passed on by srun to the `runner run` it started): the
same, recorded as preempted. SIGHUP (the terminal went away): the view detaches and the run goes on.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from runner.errors import EXIT_DETACHED
from runner.launch.supervised import SupervisedRun
from runner.record.compare import resume_sentence

POLL_S = 0.5


@dataclass
class Followed:
    """How following ended: the run's exit code, or detached (the run goes on)."""

    code: int
    detached: bool = False


@dataclass
class ViewSignals:
    """The view's signals, taken as flags and acted upon between polls (never mid-read of an event file)."""

    pending: list[int] = field(default_factory=list)
    saved: dict[int, Any] = field(default_factory=dict)

    def __enter__(self) -> ViewSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
                self.saved[sig] = signal.signal(sig, self._take)
        return self

    def _take(self, signum: int, _frame: object) -> None:
        self.pending.append(signum)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)

    def pop(self) -> int | None:
        return self.pending.pop(0) if self.pending else None


def follow(run: SupervisedRun, console: Console, plain: bool, skip_existing: bool = False,
           ask: bool = False, by: str = "runner run", signals: ViewSignals | None = None) -> Followed:
    """Show the run until it ends; act on the view's signals (those taken by `signals` already, e.g. during the
    start, included). `skip_existing`: start at the event files' ends."""
    from runner.cli.headless import HeadlessDisplay
    from runner.events.monitor import RunView

    view = RunView(run.paths.run_dir)
    if skip_existing:
        view.skip_existing()
    display = HeadlessDisplay(view, console=console, plain=plain or None)
    requested = False
    try:
        with contextlib.nullcontext(signals) if signals is not None else ViewSignals() as signals:
            while (code := run.poll()) is None:
                if view.poll():
                    display.update()
                sig = signals.pop()
                if sig == signal.SIGHUP:
                    return Followed(EXIT_DETACHED, detached=True)
                if sig is not None and not requested:
                    if sig == signal.SIGINT and ask and console.is_terminal:
                        display.close()
                        answer = _ask(console, run.run_id)
                        if answer == "detach":
                            return Followed(0, detached=True)
                        display = HeadlessDisplay(view, console=console, plain=plain or None)
                        if answer == "watch":
                            continue
                    name = signal.Signals(sig).name
                    kind = {signal.SIGINT: "cancel", signal.SIGTERM: "stop", signal.SIGUSR1: "preempt"}[sig]
                    run.request(kind, name, by=f"{name} to {by}")
                    requested = True
                    what = "cancelling" if kind == "cancel" else "stopping (with a checkpoint)"
                    console.print(f"{what} run {run.run_id} at the next step boundary…", highlight=False)
                time.sleep(POLL_S)
            view.poll()
            display.lost = run.lost
            return Followed(code)
    finally:
        try:
            display.close()
        except OSError:  # the terminal is gone (SIGHUP): nothing to draw on
            pass


def _ask(console: Console, run_id: str) -> str:
    try:
        answer = console.input(f"cancel run {run_id}? [y]es / [d]etach (it goes on) / [N]o, keep watching: ")
    except (EOFError, KeyboardInterrupt):
        return "cancel"
    answer = answer.strip().lower()
    return "cancel" if answer in ("y", "yes") else "detach" if answer in ("d", "detach") else "watch"


def say_detached(console: Console, run: SupervisedRun) -> None:
    try:
        console.print(f"detached: run {run.run_id} goes on; follow it with `runner attach {run.run_id}`, "
                      f"cancel it with `runner attach {run.run_id} --cancel`", highlight=False)
    except OSError:
        pass


def say_resumable(console: Console, rec: dict[str, Any] | None) -> None:
    """After a cancel or a lost supervisor: whether the run can be resumed, and how."""
    sentence = resume_sentence(rec)
    if sentence:
        console.print(sentence, highlight=False)

