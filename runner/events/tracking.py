"""Experiment trackers (`report.to`): TensorBoard, MLflow, W&B, Trackio, fed from the launcher process.

The ranks stay lean: they write their event files as always, and the launcher (node 0, which also writes the
record) reads rank 0's events and its node's GPU samples as they arrive and logs them: train loss (the global
loss over every rank), learning rate, gradient norm, tokens/s, memory, eval loss and token accuracy, GPU memory
and utilisation. The resolved spec is logged as parameters when the run starts; the locked record is attached
as an artifact when it is finished. Each tracker's run id or folder goes into the record (`trackers`).

Nothing here prompts: W&B runs offline unless WANDB_MODE says otherwise or an API key is configured.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from runner.events.paths import RunPaths
from runner.errors import Problem
from runner.events.lines import EvalEvent, StepEvent, parse_event
from runner.events.tail import JsonlTail

PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow-skinny"),
            "wandb": ("wandb", "wandb"), "trackio": ("trackio", "trackio")}
"""tracker -> (module to import, package to install)."""


def tracker_problems(trackers: list[str]) -> list[Problem]:
    """A problem for each tracker in report.to whose package is not installed (checked before launch)."""
    out = []
    for name in trackers:
        module, package = PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            out.append(Problem("report.to", f"'{name}' needs the {package} package, which is not installed",
                               f"pip install {package} (or pip install 'sft-tui[{name}]'), or remove {name} from "
                               "report.to"))
    return out


def flat_params(spec: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The resolved spec as flat dotted parameters (values as strings, the form trackers keep)."""
    out: dict[str, str] = {}
    for k, v in spec.items():
        if isinstance(v, dict):
            out.update(flat_params(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v) if not isinstance(v, str) else v
    return out


class _TensorBoard:
    def __init__(self, run_id: str, run_dir: Path, spec: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = RunPaths(run_dir).tensorboard
        self.writer = SummaryWriter(log_dir=str(self.dir))
        self.writer.add_text("spec", "```\n" + json.dumps(spec, indent=2) + "\n```", 0)
        self.ident = {"path": str(self.dir)}

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def finish(self, record_path: Path | None, status: str) -> None:
        if record_path is not None:
            shutil.copy2(record_path, self.dir / record_path.name)
            self.writer.add_text("record", f"{status}: {record_path.name} (copied beside these event files)", 0)
        self.writer.close()


class _MLflow:
    def __init__(self, run_id: str, run_dir: Path, spec: dict[str, Any]):
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir.parent / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps its file store only on request; it is the store that needs no server or database.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.client = MlflowClient(uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "sft-tui"
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
        self.run_id = self.client.create_run(exp_id, run_name=run_id).info.run_id
        params = [Param(k, v[:6000]) for k, v in flat_params(spec).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        self.ident = {"run_id": self.run_id, "experiment_id": exp_id, "tracking_uri": uri}

    def log(self, metrics: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k.replace("/", "_"), v, now, step)
                                                    for k, v in metrics.items()])

    def finish(self, record_path: Path | None, status: str) -> None:
        if record_path is not None:
            self.client.log_artifact(self.run_id, str(record_path))
        self.client.set_terminated(self.run_id, "FINISHED" if status == "succeeded" else
                                   "KILLED" if status == "cancelled" else "FAILED")


def _wandb_mode() -> str:
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return mode
    netrc = Path.home() / ".netrc"
    logged_in = os.environ.get("WANDB_API_KEY") or (netrc.is_file() and "api.wandb.ai" in netrc.read_text())
    return "online" if logged_in else "offline"  # never the login prompt


class _WandB:
    def __init__(self, run_id: str, run_dir: Path, spec: dict[str, Any]):
        import wandb

        self.mode = _wandb_mode()
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "sft-tui", name=run_id, config=spec,
                              dir=str(run_dir), mode=self.mode, reinit="create_new")
        self.ident = {"run_id": self.run.id, "mode": self.mode, "dir": str(Path(self.run.dir).parent)}

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self, record_path: Path | None, status: str) -> None:
        import wandb

        if record_path is not None:
            art = wandb.Artifact(f"record-{self.run.id}", type="run-record")
            art.add_file(str(record_path))
            self.run.log_artifact(art)
        self.run.finish(exit_code=0 if status == "succeeded" else 1)


class _Trackio:
    def __init__(self, run_id: str, run_dir: Path, spec: dict[str, Any]):
        import trackio

        self.trackio = trackio
        self.project = os.environ.get("TRACKIO_PROJECT") or "sft-tui"
        from trackio.utils import TRACKIO_DIR

        self.run = trackio.init(project=self.project, name=run_id, config=spec)
        self.ident = {"project": self.project, "run": run_id, "dir": str(TRACKIO_DIR)}

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self, record_path: Path | None, status: str) -> None:
        self.run.finish()


BACKENDS = {"tensorboard": _TensorBoard, "mlflow": _MLflow, "wandb": _WandB, "trackio": _Trackio}


def step_metrics(e: StepEvent | dict[str, Any], world_size: int) -> dict[str, float]:
    """Tracker metrics of one of rank 0's step events."""
    if not isinstance(e, StepEvent):
        e = StepEvent.from_line(e)
    out: dict[str, float] = {}
    loss = e.get("global_loss", e.loss)
    for key, value in (("train/loss", loss), ("train/lr", e.lr), ("train/grad_norm", e.grad_norm),
                       ("train/mem_gib", e.mem_gib)):
        if isinstance(value, (int, float)) and value == value:
            out[key] = float(value)
    if e.step_s and e.tokens is not None:
        # Rank 0's rate times the ranks: the ranks' blocks are the same size, so this is the run's rate.
        out["train/tokens_per_s"] = e.tokens * world_size / e.step_s
    return out


def open_trackers(spec: Any, run_id: str, run_dir: Path) -> Trackers | None:
    """The run's trackers (None when report.to is empty); a tracker that cannot start is a bad-input error."""
    from runner.errors import SpecError

    if not spec.report.to:
        return None
    problems = tracker_problems(spec.report.to)
    if problems:
        raise SpecError("report.to", problems)
    try:
        return Trackers(list(spec.report.to), run_id, run_dir, spec.to_dict(), spec.world_size)
    except Exception as e:  # a tracker's own failure (server unreachable, bad URI): say which, before launch
        raise SpecError("report.to", [Problem("report.to", f"could not start the tracker: {type(e).__name__}: {e}",
                                              "check the tracker's settings (e.g. MLFLOW_TRACKING_URI, WANDB_MODE)")]
                        ) from None


class Trackers:
    """The trackers of one run: open at launch, fed by `update()` from their own thread (`start()`), `finish()`
    with the locked record."""

    def __init__(self, names: list[str], run_id: str, run_dir: Path, spec: dict[str, Any], world_size: int):
        self.world_size = world_size
        self.backends: dict[str, Any] = {name: BACKENDS[name](run_id, run_dir, spec) for name in names}
        self._rank0 = JsonlTail(RunPaths(run_dir).rank_events(0))
        self._node0 = JsonlTail(RunPaths(run_dir).node_events(0))
        self._step = 0
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._feeder: threading.Thread | None = None

    @property
    def idents(self) -> dict[str, dict[str, Any]]:
        return {name: {**b.ident, **({"error": self.errors[name]} if name in self.errors else {})}
                for name, b in self.backends.items()}

    def _call(self, name: str, fn: Any, *args: Any) -> None:
        # A tracker that fails mid-run stops logging (the error goes into the record); the run goes on.
        if name in self.errors:
            return
        try:
            fn(*args)
        except Exception as e:
            self.errors[name] = f"{type(e).__name__}: {e}"

    def _log(self, metrics: dict[str, float], step: int) -> None:
        if metrics:
            for name, b in self.backends.items():
                self._call(name, b.log, metrics, step)

    def update(self) -> None:
        # Lines are logged as they come: a step logged again after a resume is logged again, last, so what a tracker
        # shows for it is the resumed run's line (the rule of runner.events.lines StepIndex).
        for e in map(parse_event, self._rank0.read_new()):
            if isinstance(e, StepEvent) and e.step is not None:
                self._step = e.step
                self._log(step_metrics(e, self.world_size), self._step)
            elif isinstance(e, EvalEvent) and e.loss is not None and e.step is not None:
                self._log({"eval/loss": e.loss, "eval/accuracy": e.accuracy or 0.0}, e.step)
        for sample in self._node0.read_new():
            gpus = {}
            for g in sample.get("gpus") or []:
                for key in ("mem_used_gib", "util_pct"):
                    if isinstance(g.get(key), (int, float)):
                        gpus[f"gpu{g.get('index', 0)}/{key}"] = float(g[key])
            self._log(gpus, self._step)

    def start(self, interval_s: float = 0.5) -> None:
        """Feed the trackers every `interval_s` from a daemon thread: a tracker's server that answers slowly (W&B,
        MLflow) then delays only its own logging, never the loop that watches the run (the dashboard's, the
        headless display's)."""
        if self._feeder is None:
            self._feeder = threading.Thread(target=self._feed, args=(interval_s,), name="trackers", daemon=True)
            self._feeder.start()

    def _feed(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.update()
            except Exception:  # noqa: BLE001 - an unreadable event line now is read again by the next update
                pass

    def stop(self) -> None:
        """Stop the feeding thread (after the update it is in): the caller updates from then on."""
        self._stop.set()
        if self._feeder is not None:
            self._feeder.join()
            self._feeder = None

    def finish(self, record_path: Path | None, status: str) -> None:
        self.stop()
        self.update()
        for name, b in self.backends.items():
            self._call(name, b.finish, record_path, status)
