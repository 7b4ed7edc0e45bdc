"""Faults: a rank killed or raising, Ctrl-C; nothing committed is lost, no process is left. (Two nodes on one
machine, through the sbatch script under a real SLURM: tests/dist/test_slurm.py.)"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from runner.record import records
from runner.events.lines import read_events
from runner.events.failure import classify_text
from tests.procs import process_tree, start_runner, wait_all_gone, wait_for_step
from tests.conftest import dir_args, last_json, run_cli

pytestmark = pytest.mark.dist


LONG = ["--set", "train.max_steps=2000", "--set", "train.log_every=1"]


def test_killed_rank_fails_the_run_with_rank_cause_and_last_steps(dirs):
    proc = start_runner(["run", "tiny-cpu", *LONG, "--json", "--plain", *dir_args(dirs)])
    run_dir, pid = wait_for_step(dirs["runs"], 3, rank=1)
    procs = process_tree(proc.pid)
    assert len(procs) >= 4  # runner, torchrun, two ranks
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    out, err = proc.communicate(timeout=60)
    assert time.time() - killed_at < 30, "the other rank was not ended within 30 s"
    assert proc.returncode == 1, err
    wait_all_gone(procs, 10)
    rec = records.load(Path(last_json(out)["record"]))
    f = rec["failure"]
    assert rec["status"] == "failed" and f["rank"] == 1 and f["cause"] == "signal"
    assert "killed by signal 9" in f["message"]
    assert f["last_steps"]["1"] >= 3 and f["last_steps"]["0"] >= 3 and f["log"].endswith("rank1.log")
    assert "rank 1 failed" in err or "rank 1 failed" in out
    assert records.verify(Path(last_json(out)["record"]))[0]


def test_killed_torchrun_is_named_by_its_signal_and_the_record_counts_the_ranks_last_step(dirs):
    """torchrun killed: the ranks get SIGTERM (PR_SET_PDEATHSIG), checkpoint and stop; the record waits for them,
    so its steps are the checkpoint's, and the failure is torchrun's signal, not a line of a rank's log."""
    proc = start_runner(["run", "tiny-cpu", *LONG, "--json", "--plain", *dir_args(dirs)])
    run_dir, _ = wait_for_step(dirs["runs"], 3)
    procs = process_tree(proc.pid)
    os.kill(int(json.loads((run_dir / "supervisor.json").read_text())["torchrun_pid"]), signal.SIGKILL)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 1, err
    wait_all_gone(procs, 10)
    path = Path(last_json(out)["record"])
    rec = records.load(path)
    f = rec["failure"]
    assert rec["status"] == "failed" and records.verify(path)[0]
    assert (f["rank"], f["cause"]) == (None, "signal"), f
    assert f["message"] == "torchrun (the launcher) killed by signal 9 (SIGKILL); no rank reported an error"
    [checkpoint] = [p.name for p in (run_dir / "checkpoints").iterdir()]
    assert checkpoint == f"step{rec['metrics']['steps']}" == f"step{f['last_step']}"
    assert f"the run failed at step {f['last_step']}: signal: torchrun" in err


def test_rank_that_raises_is_named_with_its_exception(dirs, tmp_path: Path, capsys):
    data = tmp_path / "chat.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}
    rows = [good] * 40
    rows[21] = {"messages": None}  # not a conversation: reading it raises in whichever rank streams it
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Wrapped blocks leave after a few rows, so one rank meets the bad row while its peer waits in a collective;
    # bfd would first read a 64-block buffer spanning several passes, in which each rank (the shards are drawn
    # anew each pass) meets the bad row itself.
    code, out, err = run_cli(["run", "tiny-cpu", "--set", f"dataset.path={data}", "--set", "train.seq_len=64",
                              "--set", "train.max_steps=50", "--set", "train.packing_strategy=wrapped", "--json",
                              "--plain", *dir_args(dirs)], capsys)
    assert code == 1, out + err
    rec = records.load(Path(last_json(out)["record"]))
    f = rec["failure"]
    run_dir = Path(rec["run_dir"])
    raised = [r for r in (0, 1) for e in read_events(run_dir / "events" / f"rank{r}.jsonl")
              if e.get("event") == "error" and e["message"].startswith("FormatError")]
    # The peer then fails in a collective; the record names the rank that raised first, with its last line.
    assert raised and f["rank"] == raised[0] and f["cause"] == "exception", f
    assert f["message"] == "FormatError: column 'messages' holds NoneType, not a list of messages"
    assert f["message"] in err


def test_simulated_cuda_oom_is_classified_with_size():
    text = ("Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            "30.25 GiB. GPU 3 has a total capacity of 79.19 GiB of which 1.02 GiB is free.")
    assert classify_text(text) == ("cuda_oom", "CUDA out of memory (tried to allocate 30.25 GiB)")
    cause, message = classify_text("torch.distributed.DistBackendError: NCCL error in: ..., unhandled system error")
    assert cause == "nccl_error" and "NCCL error" in message
    cause, _ = classify_text("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)")
    assert cause == "nccl_timeout"


def test_ctrl_c_cancels_with_130_and_leaves_nothing(dirs):
    proc = start_runner(["run", "tiny-cpu", *LONG, "--json", "--plain", *dir_args(dirs)])
    run_dir, _ = wait_for_step(dirs["runs"], 3)
    procs = process_tree(proc.pid)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    wait_all_gone(procs, 10)
    rec = records.load(Path(last_json(out)["record"]))
    assert rec["status"] == "cancelled" and records.verify(Path(last_json(out)["record"]))[0]
    ends = [e for r in (0, 1) for e in read_events(run_dir / "events" / f"rank{r}.jsonl") if e.get("event") == "end"]
    assert {e["reason"] for e in ends} == {"cancelled"} and len({e["step"] for e in ends}) == 1



def test_run_that_logs_no_loss_fails(dirs, tmp_path: Path, monkeypatch, capsys):
    # An engine that takes its steps and never reports a loss (TRL before 1.15 under the TRL engine did): planted by
    # a sitecustomize on the ranks' path that turns the step line into nothing. Exit 0, and still not `succeeded`.
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(
        "import os\n"
        "if 'RANK' in os.environ:\n"
        "    from runner.events import lines\n"
        "    lines.EventWriter.step = lambda self, *a, **kw: None\n")
    monkeypatch.setenv("PYTHONPATH", str(plant))  # what the supervisor, torchrun and the ranks inherit
    code, out, err = run_cli(["run", "tiny-cpu", "--set", "train.max_steps=3", "--json", "--plain", *dir_args(dirs)],
                             capsys)
    assert code == 1, out + err
    rec = records.load(Path(last_json(out)["record"]))
    f = rec["failure"]
    assert rec["status"] == "failed" and f["cause"] == "no_loss" and rec["exit_code"] == 0
    assert f["message"].startswith("ranks 0, 1 took 3 steps but logged no loss"), f
    assert records.verify(Path(last_json(out)["record"]))[0]
