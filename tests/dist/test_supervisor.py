"""The run's supervisor under real signals on real 2-rank CPU runs: SIGTERM stops with a checkpoint that resumes
the same loss curve; a SIGKILLed supervisor leaves no process and the next `runner list` finishes its record as
failed. (A view that hangs up, `runner attach` and the wizard's live view of a run started elsewhere:
tests/tui/test_live_runs.py; SLURM's preemption under a real SLURM: tests/dist/test_slurm.py.)"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from runner.record import records
from runner.events.paths import RunPaths
from runner.launch.supervisor import read_state
from tests.procs import held, process_tree, start_runner, wait_all_gone, wait_for_step, wait_until
from tests.conftest import dir_args, last_json, run_cli

pytestmark = pytest.mark.dist

LONG = ["--set", "train.max_steps=2000", "--set", "train.log_every=1"]


STEPS = 12  # the shared uninterrupted run's (tests/conftest.py tiny_run); the ranks are held while the stop is sent


def _sigterm_held(proc, runs: Path) -> Path:
    """SIGTERM to the view once both ranks logged step 2, with the ranks held until the supervisor took it: the
    stop lands mid-run however slow the machine is."""
    run_dir, _ = wait_for_step(runs, 2)
    with held([wait_for_step(runs, 2, rank=r)[1] for r in (0, 1)]):
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "stopping" in (read_state(RunPaths(run_dir)) or {}), "the supervisor stopping")
    return run_dir


def test_sigterm_stops_with_a_checkpoint_and_resume_continues_the_curve(tiny_run, dirs, capsys):
    # The resumed run must end on exactly the loss curve of the same spec run without a stop.
    sets = ["--set", f"train.max_steps={STEPS}"]
    proc = start_runner(["run", "tiny-cpu", *sets, "--json", "--plain", *dir_args(dirs)])
    wait_for_step(dirs["runs"], 1)
    procs = process_tree(proc.pid)
    assert len(procs) >= 5  # the view, the supervisor, torchrun, two ranks
    run_dir = _sigterm_held(proc, dirs["runs"])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    wait_all_gone(procs, 30)
    path = Path(last_json(out)["record"])
    rec = records.load(path)
    cancel = rec["cancel"]
    assert rec["status"] == "cancelled" and cancel["signal"] == "SIGTERM" and records.verify(path)[0]
    stopped = rec["metrics"]["steps"]
    assert 2 <= stopped < STEPS and cancel["checkpoint_step"] == stopped and cancel["resumable"]
    assert (run_dir / "checkpoints" / f"step{stopped}" / "meta.json").is_file()  # checkpoint_every is 0
    assert f"resume with `runner run --resume {run_dir}`" in err

    code, out, err = run_cli(["run", "--resume", str(run_dir), "--plain", "--json", "--records-dir",
                              str(dirs["records"])], capsys)
    assert code == 0, err
    resumed = records.load(path)
    assert resumed["resumes"][-1]["from_step"] == stopped and resumed["resumes"][-1]["previous_status"] == "cancelled"
    steps = [line.split()[1] for line in err.splitlines() if line.startswith("step ")]
    # The view starts at the events' end: the old run's lines are not replayed (the plain view prints a step line
    # at most every so often, so the first one shown may come a step or two after the checkpoint's).
    assert stopped < int(steps[0].split("/")[0]) and steps[0].endswith(f"/{STEPS}") and "run cancelled" not in err
    before = path.read_bytes()
    code, _, err = run_cli(["run", "--resume", str(run_dir), "--records-dir", str(dirs["records"])], capsys)
    assert code == 2 and "nothing to resume" in err and path.read_bytes() == before
    whole = records.load(tiny_run["record"])  # the same spec, never stopped
    assert resumed["spec"] == whole["spec"]
    assert resumed["metrics"]["loss_curve"] == whole["metrics"]["loss_curve"]


def test_sigkilled_supervisor_leaves_no_process_and_list_finishes_the_record(dirs, capsys):
    view = start_runner(["run", "tiny-cpu", *LONG, "--json", "--plain", *dir_args(dirs)])
    run_dir, _ = wait_for_step(dirs["runs"], 2)
    state = json.loads((run_dir / "supervisor.json").read_text())
    procs = process_tree(int(state["pid"]))
    assert len(procs) >= 4  # the supervisor, torchrun, two ranks
    view.kill()  # no view is left to notice: the next `runner list` must
    view.communicate(timeout=30)
    os.kill(int(state["pid"]), signal.SIGKILL)
    wait_all_gone(procs, 60)
    path = dirs["records"] / f"{run_dir.name}.json"
    assert records.load(path)["status"] == "running"
    code, out, err = run_cli(["list", "--json", "--records-dir", str(dirs["records"])], capsys)
    assert code == 0 and "supervisor lost" in err
    assert [r["status"] for r in json.loads(out)] == ["failed"]
    rec = records.load(path)
    f = rec["failure"]
    assert f["cause"] == "supervisor lost" and f["last_step"] >= 2 and f["last_steps"]["0"] >= 2
    assert records.verify(path)[0]
    # torchrun got SIGTERM when its parent died: the ranks stopped with a checkpoint, so the run can be resumed.
    assert rec["lost"]["resumable"] and rec["lost"]["checkpoint_step"] >= 2


def test_a_view_that_sees_its_supervisor_killed_says_lost_and_how_to_resume(dirs):
    """`kill -9` of the supervisor under a following `runner run`: the ranks stop with a checkpoint (SIGTERM from
    the kernel), and the view says the run failed with its supervisor lost, not that it was cancelled, then how
    to resume it."""
    view = start_runner(["run", "tiny-cpu", *LONG, "--json", "--plain", *dir_args(dirs)])
    run_dir, _ = wait_for_step(dirs["runs"], 2)
    state = json.loads((run_dir / "supervisor.json").read_text())
    os.kill(int(state["pid"]), signal.SIGKILL)
    out, err = view.communicate(timeout=120)
    assert view.returncode == 1, err
    rec = records.load(Path(last_json(out)["record"]))
    assert rec["status"] == "failed" and rec["lost"]["resumable"], rec.get("lost")
    lines = err.splitlines()
    end = next(i for i, ln in enumerate(lines) if ln.startswith("run failed at step"))
    assert lines[end].endswith(": supervisor lost") and not any(ln.startswith("run cancelled") for ln in lines), err
    assert f"supervisor lost; checkpoint at step {rec['lost']['checkpoint_step']}: resume with " \
           f"`runner run --resume {run_dir}`" in err


def test_trl_run_stopped_by_sigterm_resumes_from_the_trainers_checkpoint(dirs, capsys):
    """The TRL engine checkpoints in the Hugging Face trainer's layout (checkpoint-N): the record still says the run
    can be resumed, from where, and `runner run --resume` continues it to the same loss curve."""
    sets = ["--set", "engine=trl", "--set", f"train.max_steps={STEPS}"]
    proc = start_runner(["run", "tiny-cpu", *sets, "--json", "--plain", *dir_args(dirs)])
    run_dir = _sigterm_held(proc, dirs["runs"])
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 143, err
    path = Path(last_json(out)["record"])
    cancel = records.load(path)["cancel"]
    stopped = records.load(path)["metrics"]["steps"]
    assert 2 <= stopped < STEPS and cancel["resumable"] and cancel["checkpoint_step"] == stopped
    assert cancel["checkpoint"] == str(run_dir / "checkpoints" / f"checkpoint-{stopped}")
    # A half-written trainer checkpoint (no trainer_state.json yet) is never the one resumed from.
    (run_dir / "checkpoints" / f"checkpoint-{stopped + 1}").mkdir()
    code, out, err = run_cli(["run", "--resume", str(run_dir), "--plain", "--json", "--records-dir",
                              str(dirs["records"])], capsys)
    assert code == 0, err
    resumed = records.load(path)
    assert resumed["status"] == "succeeded" and resumed["resumes"][-1]["from_step"] == stopped
    code, out, err = run_cli(["run", "tiny-cpu", *sets, "--json", "--plain", "--run-id", "uninterrupted-trl",
                              *dir_args(dirs)], capsys)
    assert code == 0, err
    whole = records.load(Path(last_json(out)["record"]))
    assert resumed["metrics"]["loss_curve"] == whole["metrics"]["loss_curve"]
