"""`runner job`: each target written for 2 nodes x 8 GPUs from a shipped recipe and checked by the target's own
validator where it is installed; the sbatch script's resume and preemption logic run under a stub srun; bad input;
where a run ran, as its record says, and the job command replay prints for it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

import pytest
import yaml

from runner.launch.jobs import JobOptions
from runner.launch.scheduler import job_facts, scheduler_facts
from runner.launch.slurm import build_sbatch
from runner.record import records
from runner.spec import load_spec
from tests.conftest import REPO, last_json, run_cli

STUBS = REPO / "tests" / "fixtures" / "slurm_stub"
TWO_BY_EIGHT = ["--set", "hardware.nodes=2", "--set", "hardware.nproc_per_node=8"]
RECIPE = "qwen3-1.7b-full-h200"


def _job(tmp_path: Path, target: str, *extra: str) -> tuple[Path, dict, str]:
    out = tmp_path / f"job-{target}"
    code = run_cli(["job", RECIPE, "--to", target, *TWO_BY_EIGHT, "-o", str(out), "--runs-dir",
                    str(tmp_path / "runs"), "--records-dir", str(tmp_path / "records"), *extra])[0]
    assert code == 0
    [run_dir] = (tmp_path / "runs").iterdir()
    return out, json.loads((run_dir / "spec.json").read_text()), run_dir.name


def test_sbatch_script_matches_expected():
    spec = load_spec("tiny-cpu", ["hardware.nodes=4", "hardware.nproc_per_node=8", "hardware.device=cuda"])
    o = JobOptions("slurm", "r1", PurePosixPath("/shared/runs"), PurePosixPath("/shared/records"),
                   "/opt/venv/bin/python -m runner", rerun_args=("--to", "slurm"))
    script = build_sbatch(spec, "/shared/runs/r1/spec.json", o)
    assert script == (REPO / "tests" / "fixtures" / "expected_sbatch.sh").read_text()
    with_image = build_sbatch(spec, "/shared/runs/r1/spec.json",
                              JobOptions("slurm", "r1", PurePosixPath("/shared/runs"),
                                         PurePosixPath("/shared/records"), "python -m runner", image="nvcr.io/x:1"))
    assert "srun --kill-on-bad-exit=1 --container-image=nvcr.io/x:1 " \
           "--container-mounts=/shared/runs:/shared/runs,/shared/records:/shared/records bash -c" in with_image


@pytest.mark.launches
def test_slurm_job_for_two_nodes_of_eight(tmp_path):
    out, spec, run_id = _job(tmp_path, "slurm", "--time", "04:00:00", "--warn-s", "600")
    text = out.read_text()
    subprocess.run(["bash", "-n", str(out)], check=True)
    for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8", "#SBATCH --time=04:00:00",
                 "#SBATCH --signal=B:USR1@600", "#SBATCH --requeue",
                 f"#SBATCH --output={tmp_path}/runs/{run_id}/logs/slurm-%j.out"):
        assert line in text.splitlines()
    # The venv's absolute python starts runner on every node, never a bare `runner` from PATH.
    assert text.count(f"\n  {os.path.abspath(sys.executable)} -m runner run ") == 2
    assert " runner run" not in text.replace("-m runner run", "")
    assert spec["hardware"] | {"nodes": 2, "nproc_per_node": 8, "device": "cuda"} == spec["hardware"]


@pytest.mark.launches
def test_skypilot_task_for_two_nodes_of_eight(tmp_path):
    out, spec, run_id = _job(tmp_path, "skypilot", "--volume", "s3://bucket/sft", "--repo",
                             "https://example.com/sft-tui.git", "--commit", "a" * 40)
    task = yaml.safe_load(out.read_text())
    assert task["num_nodes"] == 2 and task["resources"]["accelerators"] == "H200:8"
    # SkyPilot mounts whole buckets; the prefix is a folder inside the mount.
    assert task["file_mounts"] == {"/sft-tui": {"source": "s3://bucket", "mode": "MOUNT_CACHED"}}
    assert f"git+https://example.com/sft-tui.git@{'a' * 40}" in task["setup"]
    assert json.loads(task["envs"]["SFT_TUI_SPEC"]) == spec
    for var in ("$SKYPILOT_NODE_RANK", "$SKYPILOT_NODE_IPS", "$SKYPILOT_NUM_GPUS_PER_NODE",
                f"--run-id {run_id} --runs-dir /sft-tui/sft/runs", f"--resume /sft-tui/sft/runs/{run_id}"):
        assert var in task["run"]
    subprocess.run(["bash", "-n"], input=task["run"], text=True, check=True)


SKY_CHECK = REPO / "tests" / "fixtures" / "skypilot" / "check_task.py"


def _skypilot_python() -> str:
    """A python with SkyPilot: SKYPILOT_PYTHON, the side venv .venv-sky, or this one when it has it. SkyPilot has
    dozens of dependencies, so it stays out of the dev install."""
    for python in (os.environ.get("SKYPILOT_PYTHON"), str(REPO / ".venv-sky" / "bin" / "python")):
        if python and Path(python).exists():
            return python
    pytest.importorskip("sky", reason="SkyPilot is not installed (too heavy for the dev install; 3 min to install "
                                      "on 2 cores): python3 -m venv .venv-sky && .venv-sky/bin/pip install "
                                      "skypilot==0.14.1, or set SKYPILOT_PYTHON to a python that has it")
    return sys.executable


def _sky_check(python: str, task: Path) -> str:
    done = subprocess.run([python, str(SKY_CHECK), str(task)], capture_output=True, text=True, timeout=300)
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.launches
def test_skypilot_accepts_the_task_the_readme_example_writes(tmp_path):
    """SkyPilot's own launch-time checks (tests/fixtures/skypilot/check_task.py) accept the task of the example in
    docs/multi-node.md, and refuse what they should: the bucket prefix mounted in MOUNT mode, a misspelt field."""
    python = _skypilot_python()
    out, _, _ = _job(tmp_path, "skypilot", "--set", "train.checkpoint_every=200", "--volume", "s3://my-bucket/sft",
                     "--repo", "git@github.com:you/sft-tui.git", "--commit", "a" * 40)
    assert "git+ssh://git@github.com/you/sft-tui.git@" in out.read_text()
    assert _sky_check(python, out) == "ok"
    text = out.read_text()
    refused = {"prefix in MOUNT mode": text.replace("source: s3://my-bucket\n", "source: s3://my-bucket/sft\n")
               .replace("MOUNT_CACHED", "MOUNT"), "misspelt field": text.replace("num_nodes:", "num_nodez:")}
    for what, bad in refused.items():
        path = tmp_path / "bad.yaml"
        path.write_text(bad)
        assert _sky_check(python, path) != "ok", what


@pytest.mark.parametrize("origin, expected", [
    ("git@github.com:you/x.git", "git+ssh://git@github.com/you/x.git"),
    ("https://github.com/you/x.git", "git+https://github.com/you/x.git"),
    ("ssh://git@host:2222/x.git", "git+ssh://git@host:2222/x.git"),
])
def test_git_remotes_become_lines_pip_installs(origin, expected):
    from runner.launch.skypilot import pip_git_url

    assert pip_git_url(origin) == expected


def test_a_local_folder_remote_is_refused_with_what_to_pass(tmp_path, capsys):
    code, out, err = run_cli(["job", RECIPE, "--to", "skypilot", *TWO_BY_EIGHT, "--volume", "s3://b", "--repo",
                              str(tmp_path), "--commit", "a" * 40, "--runs-dir", str(tmp_path / "runs")], capsys)
    assert code == 2 and "is a folder on this machine" in err and "--repo https://" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.launches
def test_kubeflow_trainjob_for_two_nodes_of_eight(tmp_path):
    out, spec, run_id = _job(tmp_path, "kubeflow", "--image", "ghcr.io/x/sft-tui:1", "--volume", "sft-runs")
    doc = yaml.safe_load(out.read_text())
    trainer = doc["spec"]["trainer"]
    assert doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and doc["kind"] == "TrainJob"
    assert doc["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert trainer["numNodes"] == 2 and trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"
    script = trainer["command"][2]
    for var in ('"$PET_NODE_RANK"', '"$PET_MASTER_ADDR:$PET_MASTER_PORT"', f"--run-id {run_id}"):
        assert var in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert json.loads(trainer["env"][0]["value"]) == spec
    models = pytest.importorskip("kubeflow_trainer_api.models.trainer_v1alpha1_train_job",
                                 reason="kubeflow-trainer-api (the dev extra) is not installed")
    # The SDK's model drops what the API does not know: the round trip is equal only when every field is the API's.
    assert models.TrainerV1alpha1TrainJob.from_dict(doc).to_dict() == doc
    doc["spec"]["trainer"]["numNode"] = 2
    assert models.TrainerV1alpha1TrainJob.from_dict(doc).to_dict() != doc


@pytest.mark.parametrize("args, expected", [
    (["--to", "lsf"], "--to expects one of slurm, skypilot, kubeflow, got 'lsf'"),
    (["--to", "kubeflow", "--volume", "v"], "--to kubeflow needs --image IMAGE"),
    (["--to", "kubeflow", "--image", "i"], "--to kubeflow needs --volume"),
    (["--to", "skypilot", "--repo", "r"], "--to skypilot needs --volume"),
    (["--to", "slurm", "--time", "1 day"], "--time expects SLURM's [D-]HH:MM:SS"),
    (["--to", "slurm", "--port", "0"], "--port expects a TCP port (1-65535)"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, expected):
    code, out, err = run_cli(["job", RECIPE, *TWO_BY_EIGHT, *args, "--runs-dir", str(tmp_path / "runs"),
                              "--records-dir", str(tmp_path / "records")], capsys)
    assert code == 2 and err.startswith(f"error: {expected}") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_ranks_per_node_must_be_given(tmp_path, capsys):
    code, _, err = run_cli(["slurm", RECIPE, "--set", "hardware.nproc_per_node=auto", "--runs-dir",
                            str(tmp_path / "runs")], capsys)
    assert code == 2 and "needs hardware.nproc_per_node" in err and not (tmp_path / "runs").exists()


# runner for the script's tests: says which node ran which command, then waits for USR1 when asked to. Python, as
# runner is: the script starts it with USR1 ignored, which a shell could not trap again.
FAKE_RUNNER = f"""#!{sys.executable}
import os, signal, sys, time
node = os.environ["SLURM_NODEID"]
def say(what):
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(f"node {{node}}: {{what}}\\n")
say(" ".join(sys.argv[1:]))
if os.environ.get("FAKE_WAIT"):
    signal.signal(signal.SIGUSR1, lambda *_: (say("usr1"), os._exit(143)))
    while True:
        time.sleep(0.05)
"""


def _script_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{STUBS}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "127.0.0.1", "SLURM_NNODES": "2", "FAKE_LOG": str(tmp_path / "fake.log"),
            "SCONTROL_LOG": str(tmp_path / "scontrol.log"), **extra}


def _fake_job(tmp_path: Path) -> tuple[Path, Path]:
    fake = tmp_path / "fake-runner"
    fake.write_text(FAKE_RUNNER)
    fake.chmod(0o755)
    code = run_cli(["job", "tiny-cpu", "--to", "slurm", "--set", "hardware.nodes=2", "--runner", str(fake),
                    "-o", str(tmp_path / "job.sh"), "--runs-dir", str(tmp_path / "runs"),
                    "--records-dir", str(tmp_path / "records")])[0]
    assert code == 0
    [run_dir] = (tmp_path / "runs").iterdir()
    return tmp_path / "job.sh", run_dir


@pytest.mark.launches
def test_sbatch_starts_fresh_then_resumes_from_a_checkpoint(tmp_path):
    script, run_dir = _fake_job(tmp_path)
    env = _script_env(tmp_path)
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=60)
    (run_dir / "events" / "rank1.jsonl").write_text("{}\n")  # the first attempt's steps
    (run_dir / "events" / "node1.jsonl").write_text("{}\n")
    (run_dir / "checkpoints" / "step3").mkdir(parents=True)  # incomplete (no meta.json): not resumed from
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=60)
    # Started again from step 0: the old rank events went aside, so the new record does not count them twice.
    [aside] = run_dir.glob("events.before-*")
    assert [p.name for p in aside.iterdir()] == ["rank1.jsonl"]
    assert sorted(p.name for p in (run_dir / "events").iterdir()) == ["node1.jsonl"]
    (run_dir / "checkpoints" / "step3" / "meta.json").write_text("{}")
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=60)
    lines = sorted((tmp_path / "fake.log").read_text().splitlines())
    fresh = [ln for ln in lines if f"run {run_dir}/spec.json --run-id {run_dir.name} " in ln]
    resumed = [ln for ln in lines if f"run --resume {run_dir} " in ln]
    assert len(lines) == 6 and len(fresh) == 4 and len(resumed) == 2
    assert [ln.split(":")[0] for ln in resumed] == ["node 0", "node 1"]
    assert all(f"--node-rank {ln[5]} " in ln and "hardware.rdzv_endpoint=127.0.0.1:29500" in ln for ln in lines)


@pytest.mark.launches
def test_a_requeued_trl_job_resumes_from_the_trainers_checkpoint(tmp_path):
    script, run_dir = _fake_job(tmp_path)
    env = _script_env(tmp_path)
    trl = run_dir / "checkpoints" / "checkpoint-4"
    trl.mkdir(parents=True)  # being written: no trainer_state.json yet
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=60)
    (trl / "trainer_state.json").write_text("{}")
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=60)
    lines = (tmp_path / "fake.log").read_text().splitlines()
    assert [f"run --resume {run_dir} " in ln for ln in lines] == [False, False, True, True]


@pytest.mark.launches
def test_usr1_before_the_time_limit_reaches_every_node_and_requeues(tmp_path):
    script, _ = _fake_job(tmp_path)
    proc = subprocess.Popen(["bash", str(script)], env=_script_env(tmp_path, FAKE_WAIT="1"))
    log = tmp_path / "fake.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and len(log.read_text().splitlines()) == 2):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=60) == 0
    assert sorted(ln for ln in log.read_text().splitlines() if ln.endswith("usr1")) == ["node 0: usr1",
                                                                                       "node 1: usr1"]
    assert (tmp_path / "scontrol.log").read_text().splitlines()[-1] == "requeue 4242"


@pytest.mark.launches
def test_without_usr1_a_failed_node_fails_the_job_and_nothing_is_requeued(tmp_path):
    script, _ = _fake_job(tmp_path)
    broken = tmp_path / "fake-runner"
    broken.write_text("#!/bin/bash\nexit 7\n")
    done = subprocess.run(["bash", str(script)], env=_script_env(tmp_path), timeout=60)
    assert done.returncode == 7
    assert "requeue" not in (tmp_path / "scontrol.log").read_text()


def test_where_a_node_runs():
    assert scheduler_facts({}) is None and job_facts({}) is None
    slurm = scheduler_facts({"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_NUM_NODES": "2",
                             "SLURM_RESTART_COUNT": "1"})
    assert slurm == {"name": "slurm", "job_id": "77", "nodes": "gpu[01-02]", "node_count": 2, "restart_count": 1,
                     "cluster": None}
    sky = scheduler_facts({"SKYPILOT_TASK_ID": "sky-1", "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2"})
    assert sky == {"name": "skypilot", "job_id": "sky-1", "nodes": ["10.0.0.1", "10.0.0.2"], "node_count": 2}
    k8s = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOSTNAME": "sft-x-node-0-0", "PET_NNODES": "2",
           "SFT_TUI_JOB": json.dumps({"target": "kubeflow", "name": "sft-x", "rerun_args": []})}
    assert scheduler_facts(k8s) == {"name": "kubernetes", "job_id": "sft-x", "nodes": "sft-x-node-0-0",
                                    "node_count": 2}
    assert job_facts({"SFT_TUI_JOB": "not json"}) is None


def test_replay_of_a_job_record_prints_the_job_command(tmp_path, capsys):
    spec = load_spec("tiny-cpu", ["hardware.nodes=2", "hardware.nproc_per_node=1"]).to_dict()
    launch = {"argv": [], "scheduler": {"name": "slurm", "job_id": "4242", "nodes": "gpu[1-2]", "node_count": 2},
              "job": {"target": "slurm", "name": "tiny-cpu", "rerun_args": ["--to", "slurm", "--time", "01:00:00"]}}
    path = tmp_path / "records" / "r9.json"
    records.save(path, records.new_record("r9", spec, {}, launch, None, tmp_path / "runs" / "r9"))
    code, out, _ = run_cli(["replay", "r9", "--records-dir", str(tmp_path / "records")], capsys)
    assert code == 0
    assert "r9 ran as a slurm job (job 4242 on 2 node(s): gpu[1-2])" in out
    assert f"runner job {path} --to slurm --time 01:00:00 -o r9-rerun.sh" in out and "sbatch r9-rerun.sh" in out
    code, out, _ = run_cli(["replay", "r9", "--json", "--records-dir", str(tmp_path / "records")], capsys)
    result = last_json(out)
    assert code == 0 and result["reproduced"] is None and result["commands"][1] == "sbatch r9-rerun.sh"
    # The printed command writes the same job from the record: its spec, its options.
    code = run_cli(["job", str(path), "--to", "slurm", "--time", "01:00:00", "-o", str(tmp_path / "again.sh"),
                    "--runs-dir", str(tmp_path / "runs2"), "--records-dir", str(tmp_path / "records")])[0]
    assert code == 0 and "#SBATCH --time=01:00:00" in (tmp_path / "again.sh").read_text()
    [again] = (tmp_path / "runs2").iterdir()
    assert json.loads((again / "spec.json").read_text())["hardware"]["nodes"] == 2
