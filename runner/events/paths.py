"""The run folder's layout: where a run's spec, events, logs, checkpoints and exports live. Every path into a run
folder is built here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


CHECKPOINT_LAYOUTS = (("step", "meta.json"), ("checkpoint-", "trainer_state.json"))
"""(folder prefix, the file written last) of the native engine's checkpoints and of the Hugging Face trainer's
(the TRL engine's): a checkpoint folder is complete only once that file exists."""


CHECKPOINT_META = CHECKPOINT_LAYOUTS[0][1]
"""The native engine's last-written checkpoint file (step, world size): its presence marks that engine's layout."""


def _checkpoint_step(path: Path) -> int | None:
    """The step of a complete checkpoint folder, None for anything else (a half-written one included)."""
    for prefix, last in CHECKPOINT_LAYOUTS:
        rest = path.name[len(prefix):]
        if path.name.startswith(prefix) and rest.isdigit() and (path / last).is_file():
            return int(rest)
    return None


@dataclass
class RunPaths:
    run_dir: Path

    @classmethod
    def of_events(cls, events_dir: Path) -> RunPaths:
        """The run folder around an events folder."""
        return cls(Path(events_dir).parent)

    @property
    def spec(self) -> Path:
        return self.run_dir / "spec.json"

    @property
    def decisions(self) -> Path:
        """The run's decisions (runner.decide), written once beside the spec before launch; every rank reads it."""
        return self.run_dir / "decisions.json"

    @property
    def events(self) -> Path:
        return self.run_dir / "events"

    def rank_events(self, rank: int) -> Path:
        return self.events / f"rank{rank}.jsonl"

    def node_events(self, node: int) -> Path:
        return self.events / f"node{node}.jsonl"

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    @property
    def launcher_log(self) -> Path:
        return self.logs / "launcher.log"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def step_checkpoint(self, step: int) -> Path:
        """The native engine's checkpoint folder of a step (complete once its meta.json exists)."""
        return self.checkpoints / f"step{step}"

    def complete_checkpoints(self) -> list[tuple[int, Path]]:
        """(step, folder) of every complete checkpoint of either engine, oldest first: a half-written one (no last
        file yet, or the native engine's hidden `.step<N>.tmp`) is never listed, so nothing resumes from it."""
        if not self.checkpoints.is_dir():
            return []
        return sorted((step, p) for p in self.checkpoints.iterdir() if (step := _checkpoint_step(p)) is not None)

    def latest_checkpoint(self) -> Path | None:
        done = self.complete_checkpoints()
        return done[-1][1] if done else None

    @property
    def export(self) -> Path:
        return self.run_dir / "export"

    @property
    def tensorboard(self) -> Path:
        return self.run_dir / "tensorboard"

    @property
    def supervisor(self) -> Path:
        """The supervisor's pid, host, state and, once finished, exit code (runner/launch/supervisor.py)."""
        return self.run_dir / "supervisor.json"

    @property
    def control(self) -> Path:
        """Requests from views to the supervisor, one JSON line each (cancel, stop)."""
        return self.run_dir / "control"

    @property
    def view_result(self) -> Path:
        """The `--json` line of a view that hung up (SIGHUP): its terminal is gone, the line lands here."""
        return self.run_dir / "view-result.json"

    @property
    def supervisor_log(self) -> Path:
        return self.logs / "supervisor.log"
