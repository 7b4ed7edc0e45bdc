"""One handle on a launched run, whichever process runs it: the in-process `ActiveRun` (runner.launch.run) and the
view's `SupervisedRun` (runner.launch.supervised) both are a `RunHandle`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from runner.events.monitor import RunView
from runner.events.paths import RunPaths


@runtime_checkable
class RunHandle(Protocol):
    """What the wizard's dashboard and the headless session ask of a run: its state (`poll`, `ended`, `cancelled`), its
    events and progress (`view`, over `paths`), `cancel`/`stop`, `wait`, and its result (`finish`, `record`)."""

    @property
    def run_id(self) -> str: ...

    @property
    def spec(self) -> Any: ...

    @property
    def paths(self) -> RunPaths: ...

    @property
    def record_path(self) -> Path | None: ...

    @property
    def record(self) -> dict[str, Any] | None: ...

    @property
    def cancelled(self) -> bool:
        """Whether a cancel or a stop was asked for (the record then says `cancelled`)."""
        ...

    @property
    def ended(self) -> bool:
        """Whether the run's process has said its last word, as last seen (no polling)."""
        ...

    def poll(self) -> int | None:
        """None while the run goes on; its exit code once it ended."""
        ...

    def view(self, clock: Callable[[], float] = time.time) -> RunView:
        """A live view model over the run's event files (per-rank steps, loss, GPUs); its `poll()` reads more."""
        ...

    def cancel(self) -> None:
        """Stop at the next step boundary, without a checkpoint beyond those train.checkpoint_every writes."""
        ...

    def stop(self) -> None:
        """Stop at the next step boundary with a checkpoint, so that the run can be resumed."""
        ...

    def wait(self) -> int:
        """Block until the run ended; its exit code."""
        ...

    def finish(self, exit_code: int) -> dict[str, Any] | None:
        """The run's record as it ends (None on a node other than 0, which writes none)."""
        ...


def run_view(paths: RunPaths, clock: Callable[[], float] = time.time) -> RunView:
    """The view model both handles give: the run folder's events, read from their start."""
    return RunView(paths.run_dir, clock=clock)
