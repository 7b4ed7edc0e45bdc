"""`runner job --to slurm` under a real SLURM (tests/slurm_cluster.py), one node and two: submitted with sbatch,
preempted by USR1 (`scancel --signal=USR1 --batch`, SLURM's own warning before a time limit, and on one node USR1
to every process of the step but not the batch shell), requeued, and resumed into the same record with the loss
curve of the uninterrupted run, every rank and step."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from runner.events.lines import read_events
from runner.record import records
from tests.conftest import run_cli
from tests.procs import held, wait_until
from tests.slurm_cluster import Cluster, free_ports

pytestmark = pytest.mark.dist

STEPS = 12  # the shared uninterrupted run's (tests/conftest.py tiny_run)
WARN_S = 600
TIMEOUT_S = 300
# Job states that end a job (a requeued job passes through COMPLETING and REQUEUED on its way to PENDING).
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def _wait(cond, what: str, cluster: Cluster, timeout_s: float = TIMEOUT_S, run_dir: Path | None = None,
          job: str | None = None):
    """wait_until, and on failure what the job and its daemons say."""
    try:
        return wait_until(cond, what, timeout_s)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{_diagnose(cluster, run_dir, job)}") from None


def _diagnose(cluster: Cluster, run_dir: Path | None, job: str | None, tail: int = 2500) -> str:
    """What a failed wait shows: the job's state, the run's own logs (the job's output, each node's supervisor),
    then the daemons' logs."""
    parts = []
    if job is not None:
        parts.append(f"== job {job}: {cluster.job_state(job)}")
    if run_dir is not None:
        for p in sorted([*run_dir.glob("supervisor*.json"), *(run_dir / "logs").glob("*")]):
            if p.is_file():
                parts.append(f"== {p.relative_to(run_dir)}\n{p.read_text(errors='replace')[-tail:]}")
    return "\n".join([*parts, cluster.logs()])


def _attempt_ranks(run_dir: Path, world: int, past_step: int) -> list[int] | None:
    """The pids of this attempt's ranks once each has logged a step after `past_step` (the attempt's checkpoint)."""
    pids = []
    for r in range(world):
        evs = read_events(run_dir / "events" / f"rank{r}.jsonl")
        starts = [i for i, e in enumerate(evs) if e.get("event") == "start"]
        if not starts or not any("event" not in e and e.get("step", 0) > past_step for e in evs[starts[-1]:]):
            return None
        pids.append(int(evs[starts[-1]]["pid"]))
    return pids


def _states(run_dir: Path, nodes: int) -> list[dict]:
    out = []
    for n in range(nodes):
        try:
            out.append(json.loads((run_dir / ("supervisor.json" if n == 0 else f"supervisor-node{n}.json")).read_text()))
        except (OSError, ValueError):
            out.append({})
    return out


def _preempt(cluster: Cluster, job: str, run_dir: Path, nodes: int, world: int, past_step: int, how: str) -> None:
    """Hold the attempt's ranks (SIGSTOP) once they trained past `past_step`, so that the preemption lands mid-run
    however slow this machine is, preempt the job `how`, and let the ranks go once every node's supervisor has
    taken the request."""
    def ranks() -> list[int] | None:
        state = cluster.job_state(job)["JobState"]
        assert state not in ENDED, f"job {job} {state} before its preemption:\n" + "\n".join(
            p.read_text()[-3000:] for p in sorted(run_dir.glob("logs/*.log")) + sorted(run_dir.glob("logs/*.out")))
        return _attempt_ranks(run_dir, world, past_step)

    pids = _wait(ranks, f"attempt past step {past_step}", cluster, run_dir=run_dir, job=job)
    with held(pids):
        if how == "batch":
            cluster.scancel("--signal=USR1", "--batch", job)
        elif how == "step":  # every process of the step, as slurmstepd delivers it; the batch shell gets none
            cluster.scancel("--signal=USR1", job)
        else:  # SLURM's warning: a time limit that leaves less than --warn-s, more than the next check needs
            elapsed = _seconds(cluster.job_state(job)["RunTime"])
            cluster.scontrol("update", f"JobId={job}", f"TimeLimit={math.ceil(elapsed / 60) + 2}")
        _wait(lambda: all("stopping" in s for s in _states(run_dir, nodes)), "every supervisor stopping", cluster,
              90, run_dir, job)
        if how == "warning":
            # The warning was taken: the next attempt gets its time back.
            cluster.scontrol("update", f"JobId={job}", "TimeLimit=30")


def _seconds(hms: str) -> int:
    days, _, hms = hms.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


# Each way once: on two nodes the batch shell's USR1 (`scancel --batch`) and SLURM's own warning, which srun passes
# on to every process of the step on every node; on one node the USR1 to the step alone, which spares the batch
# shell (so an operator requeues the job).
@pytest.mark.parametrize(("nodes", "ways"), [(1, ("step",)), (2, ("batch", "warning"))])
def test_preempted_requeued_and_resumed_to_the_uninterrupted_curve(slurm, tiny_run, tmp_path, capsys, nodes, ways):
    runs, recs, script = tmp_path / "runs", tmp_path / "records", tmp_path / "job.sh"
    code = run_cli(["job", "tiny-cpu", "--to", "slurm", "--set", f"hardware.nodes={nodes}", "--set",
                    f"hardware.nproc_per_node={2 // nodes}", "--set", f"train.max_steps={STEPS}",
                    "--time", "30:00", "--warn-s", str(WARN_S), "--port", str(free_ports(1)[0]),
                    "-o", str(script), "--runs-dir", str(runs), "--records-dir", str(recs)])[0]
    assert code == 0
    [run_dir] = runs.iterdir()
    path = recs / f"{run_dir.name}.json"
    job = slurm.sbatch(script, cwd=tmp_path)
    checkpoint, steps = 0, []
    for attempt, how in enumerate(ways):
        _preempt(slurm, job, run_dir, nodes, 2, checkpoint, how)
        _wait(lambda: all(s.get("state") == "finished" for s in _states(run_dir, nodes)), "the attempt's end", slurm,
              run_dir=run_dir, job=job)
        rec = records.load(path)
        cancel = rec["cancel"]
        assert (rec["status"], cancel["cause"], cancel["signal"], rec["exit_code"]) == \
            ("cancelled", "preempted", "SIGUSR1", 143), (how, rec["status"], cancel, rec.get("failure"))
        assert [(s["status"], s["exit_code"]) for s in _states(run_dir, nodes)] == [("cancelled", 143)] * nodes
        assert checkpoint < cancel["checkpoint_step"] == rec["metrics"]["steps"] < STEPS, (how, cancel)
        assert (run_dir / "checkpoints" / f"step{cancel['checkpoint_step']}" / "meta.json").is_file()
        assert records.verify(path)[0]
        checkpoint = cancel["checkpoint_step"]
        steps.append(checkpoint)
        state = _wait(lambda: (s := slurm.job_state(job)) and int(s["Restarts"]) == attempt + 1 and s,
                      "the job requeued by its script", slurm, run_dir=run_dir,
                      job=job) if how != "step" else None
        if how == "step":
            # Only the step was signalled: the batch shell ends with the run's 143 and, as SLURM's own
            # preemption would, an operator requeues the job.
            state = _wait(lambda: (s := slurm.job_state(job)) and s["JobState"] == "FAILED" and s,
                          "the job's end", slurm)
            assert state["ExitCode"] == "143:0", state
            slurm.scontrol("requeue", job)
        # srun has ended: no node's graceful stop counted as a failed task that terminates the others' step
        # (--kill-on-bad-exit).
        assert "Terminating StepId" not in (run_dir / "logs" / f"slurm-{job}.out").read_text()
    state = _wait(lambda: (s := slurm.job_state(job)) and s["JobState"] in ENDED and s, "the job's end", slurm,
                  run_dir=run_dir, job=job)
    assert state["JobState"] == "COMPLETED", _diagnose(slurm, run_dir, job)
    rec = records.load(path)
    assert rec["status"] == "succeeded" and records.verify(path)[0], rec.get("failure")
    # Each attempt resumed the same run id from the checkpoint the one before wrote, as SLURM's restarts 1, 2, ...
    assert [r["previous_status"] for r in rec["resumes"]] == ["cancelled"] * len(ways)
    assert [r["from_step"] for r in rec["resumes"]] == steps
    assert [r["scheduler"]["restart_count"] for r in rec["resumes"]] == list(range(1, len(ways) + 1))
    assert rec["launch"]["scheduler"] == {"name": "slurm", "job_id": job, "nodes": state["NodeList"],
                                          "node_count": nodes, "restart_count": 0, "cluster": "sfttest"}
    assert rec["launch"]["job"]["target"] == "slurm" and rec["launch"]["nodes"] == nodes
    whole = records.load(tiny_run["record"])
    assert rec["metrics"]["loss_curve"] == whole["metrics"]["loss_curve"]
    capsys.readouterr()
    code, out, _ = run_cli(["replay", str(path)], capsys)
    assert code == 0 and f"runner job {path} --to slurm " in out and f"sbatch {run_dir.name}-rerun.sh" in out
