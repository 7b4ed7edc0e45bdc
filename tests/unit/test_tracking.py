"""Experiment trackers fed from a run's event files, written for real and read back with each library's own reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.events import tracking
from runner.errors import SpecError
from runner.spec import load_spec
from runner.events.tracking import Trackers, open_trackers, tracker_problems

STEPS = 6


def _events(run_dir: Path) -> None:
    ev = run_dir / "events"
    ev.mkdir(parents=True)
    rows = [{"t": 1.0, "rank": 0, "event": "start"}]
    for s in range(1, STEPS + 1):
        rows.append({"t": 1.0 + s, "rank": 0, "step": s, "loss": 9.0, "global_loss": 5.0 / s, "lr": 1e-3 * s,
                     "grad_norm": 1.5, "tokens": 512, "step_s": 0.5, "mem_gib": 0.25})
        if s % 3 == 0:
            rows.append({"t": 1.0 + s, "rank": 0, "event": "eval", "step": s, "loss": 4.0 / s, "accuracy": 0.1 * s})
    (ev / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (ev / "node0.jsonl").write_text(json.dumps({"t": 2.0, "node": 0, "gpus": [
        {"index": 0, "mem_used_gib": 41.5, "util_pct": 97.0}]}) + "\n")


def _run(tmp_path: Path, names: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[Trackers, Path]:
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / "r1"
    _events(run_dir)
    spec = load_spec("tiny-cpu", [f"report.to={json.dumps(names)}"])
    trackers = open_trackers(spec, "r1", run_dir)
    assert trackers is not None
    trackers.update()
    record = tmp_path / "r1.json"
    record.write_text(json.dumps({"id": "r1", "lock": "abc"}))
    trackers.finish(record, "succeeded")
    assert not trackers.errors
    return trackers, record


def test_tensorboard_event_files_read_back(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trackers, record = _run(tmp_path, ["tensorboard"], monkeypatch)
    path = Path(trackers.idents["tensorboard"]["path"])
    assert path == tmp_path / "runs" / "r1" / "tensorboard"
    acc = EventAccumulator(str(path))
    acc.Reload()
    loss = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert loss == [(s, pytest.approx(5.0 / s)) for s in range(1, STEPS + 1)]  # the global loss, not rank 0's
    assert [(e.step, round(e.value, 5)) for e in acc.Scalars("eval/loss")] == [(3, round(4 / 3, 5)), (6, 0.66667)]
    assert [e.value for e in acc.Scalars("train/tokens_per_s")] == [pytest.approx(512 * 2 / 0.5)] * STEPS
    assert acc.Scalars("gpu0/mem_used_gib")[0].value == pytest.approx(41.5)
    assert {"train/lr", "train/grad_norm", "train/mem_gib", "eval/accuracy"} <= set(acc.Tags()["scalars"])
    assert "spec" in " ".join(acc.Tags()["tensors"])  # add_text lands as a tensor summary
    assert json.loads((path / record.name).read_text())["lock"] == "abc"  # the locked record beside them


def test_mlflow_file_store_read_back(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from mlflow import MlflowClient

    trackers, record = _run(tmp_path, ["mlflow"], monkeypatch)
    ident = trackers.idents["mlflow"]
    assert ident["tracking_uri"] == (tmp_path / "runs" / "mlruns").as_uri()
    client = MlflowClient(ident["tracking_uri"])
    run = client.get_run(ident["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "r1"
    assert run.data.params["train.seq_len"] == "512" and run.data.params["model.id"] == "sft-tui/tiny-qwen3"
    hist = client.get_metric_history(ident["run_id"], "eval_loss")
    assert sorted((m.step, round(m.value, 5)) for m in hist) == [(3, round(4 / 3, 5)), (6, 0.66667)]
    assert len(client.get_metric_history(ident["run_id"], "train_loss")) == STEPS
    assert [a.path for a in client.list_artifacts(ident["run_id"])] == [record.name]


@pytest.mark.launches
def test_wandb_offline_run_dir(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    trackers, _ = _run(tmp_path, ["wandb"], monkeypatch)
    ident = trackers.idents["wandb"]
    run_dir = Path(ident["dir"])
    assert ident["mode"] == "offline" and run_dir.parent.parent == tmp_path / "runs" / "r1"
    assert run_dir.name.startswith("offline-run-") and run_dir.name.endswith(ident["run_id"])
    assert list(run_dir.glob("*.wandb")), "the offline run's data file"


def test_wandb_never_prompts_without_a_key(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tracking._wandb_mode() == "offline"


TRACKIO_READ_BACK = """
import json, sys
from pathlib import Path
from typing import Any
from runner.spec import load_spec
from runner.events.tracking import open_trackers
from tests.unit.test_tracking import _events
tmp = Path(sys.argv[1])
_events(tmp / "runs" / "r1")
trackers = open_trackers(load_spec("tiny-cpu", ["report.to=[trackio]"]), "r1", tmp / "runs" / "r1")
trackers.finish(None, "succeeded")
from trackio.sqlite_storage import SQLiteStorage
logs = SQLiteStorage.get_logs("sft-tui-test", "r1")
print(json.dumps({"ident": trackers.idents["trackio"], "errors": trackers.errors,
                  "eval": [(d["step"], d["eval/loss"]) for d in logs if "eval/loss" in d],
                  "train": len([d for d in logs if "train/loss" in d])}))
"""


@pytest.mark.launches
def test_trackio_local_run_read_back(tmp_path):
    pytest.importorskip("trackio")
    import os
    import subprocess
    import sys

    # Trackio reads TRACKIO_DIR once, at import: a process of its own keeps it inside tmp_path.
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "TRACKIO_PROJECT": "sft-tui-test"}
    out = subprocess.run([sys.executable, "-c", TRACKIO_READ_BACK, str(tmp_path)], env=env, capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
    assert got["errors"] == {} and got["ident"]["dir"] == str(tmp_path / "trackio")
    assert [(s, round(v, 5)) for s, v in got["eval"]] == [(3, round(4 / 3, 5)), (6, 0.66667)]
    assert got["train"] == STEPS


def test_missing_tracker_names_the_package(monkeypatch):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda m: None if m == "mlflow" else real(m))
    problems = tracker_problems(["tensorboard", "mlflow"])
    assert len(problems) == 1 and problems[0].field == "report.to"
    assert "mlflow-skinny" in problems[0].message and "pip install mlflow-skinny" in problems[0].fix


def test_report_to_rejects_unknown_and_repeated_trackers():
    with pytest.raises(SpecError) as e:
        load_spec("tiny-cpu", ["report.to=[comet]"])
    assert "report.to" in str(e.value)
    with pytest.raises(SpecError) as e:
        load_spec("tiny-cpu", ["report.to=[mlflow, mlflow]"])
    assert "twice" in str(e.value)


def test_every_tracker_is_named_once_and_has_its_package_and_extra():
    import tomllib

    from runner.events.tracking import PACKAGES
    from runner.spec import TRACKERS

    assert list(PACKAGES) == list(TRACKERS)
    extras = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    extras = extras["project"]["optional-dependencies"]
    for name, (_, package) in PACKAGES.items():
        assert any(req.startswith(package) for req in extras[name]), (name, extras.get(name))


def test_a_tracker_that_hangs_never_blocks_the_loop_watching_the_run(tmp_path):
    """Trackers are fed from their own thread: while one hangs (a W&B or MLflow server that does not answer), the
    run's poll (the dashboard's and the headless display's tick) returns and reads nothing for the trackers."""
    import threading
    import time

    from runner.events.paths import RunPaths
    from runner.launch.run import ActiveRun

    hanging, answer = threading.Event(), threading.Event()
    calls: list[tuple[str, Any]] = []

    class Hanging:
        ident = {"kind": "hanging"}

        def __init__(self, run_id: str, run_dir: Path, spec: dict[str, Any]) -> None:
            pass

        def log(self, metrics: dict[str, float], step: int) -> None:
            calls.append((threading.current_thread().name, step))
            if not hanging.is_set():
                hanging.set()
                answer.wait(30)

        def finish(self, record_path: Path | None, status: str) -> None:
            calls.append((threading.current_thread().name, "finish"))

    class Running:
        def poll(self) -> int | None:
            return None

    run_dir = tmp_path / "r1"
    _events(run_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(tracking.BACKENDS, "hanging", Hanging)
        trackers = Trackers(["hanging"], "r1", run_dir, {}, 2)
    run = ActiveRun("r1", load_spec("tiny-cpu"), RunPaths(run_dir), None, None, Running(), trackers=trackers)
    trackers.start(interval_s=0.01)
    assert hanging.wait(30)
    with (run_dir / "events" / "rank0.jsonl").open("a") as f:  # a step arrives while the tracker hangs
        f.write(json.dumps({"t": 9.0, "rank": 0, "step": STEPS + 1, "loss": 1.0, "global_loss": 1.0}) + "\n")
    assert run.poll() is None
    answer.set()
    deadline = time.monotonic() + 30
    while STEPS + 1 not in [step for _, step in calls]:
        assert time.monotonic() < deadline, calls
        time.sleep(0.01)
    trackers.finish(None, "succeeded")
    assert calls[-1] == (threading.current_thread().name, "finish")
    assert {name for name, _ in calls[:-1]} == {"trackers"}, calls  # every log from the trackers' thread
    assert [step for _, step in calls[:-1]][-1] == STEPS + 1 and trackers._feeder is None
