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
