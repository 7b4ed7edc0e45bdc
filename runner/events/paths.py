"""The run folder's layout: where a run's spec, events and logs live."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class RunPaths:
    run_dir: Path

    @property
    def spec(self) -> Path:
        return self.run_dir / "spec.json"

    @property
    def events(self) -> Path:
        return self.run_dir / "events"

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    @property
    def launcher_log(self) -> Path:
        return self.logs / "launcher.log"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    @property
    def supervisor(self) -> Path:
        """The supervisor's pid, host, state and, once finished, exit code (runner/launch/supervisor.py)."""
        return self.run_dir / "supervisor.json"

    @property
    def control(self) -> Path:
        """Requests from views to the supervisor, one JSON line each (cancel, stop)."""
        return self.run_dir / "control"

    @property
    def supervisor_log(self) -> Path:
        return self.logs / "supervisor.log"
