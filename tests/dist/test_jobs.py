"""The sbatch script `runner job --to slurm` writes, run end to end on this machine: a stub srun starts two local
"nodes" (two `runner run`, node ranks 0 and 1, one CPU rank each, c10d on localhost), and they make one run with
one record."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from runner.events.lines import read_events
from runner.record import records
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.dist

STUBS = REPO / "tests" / "fixtures" / "slurm_stub"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sbatch_script_runs_two_nodes_into_one_record(tmp_path, capsys):
    runs, recs = tmp_path / "runs", tmp_path / "records"
    script = tmp_path / "job.sh"
    code = run_cli(["job", "tiny-cpu", "--to", "slurm", "--set", "hardware.nodes=2", "--set",
                    "hardware.nproc_per_node=1", "--set", "train.max_steps=4", "--port", str(_free_port()),
                    "-o", str(script), "--runs-dir", str(runs), "--records-dir", str(recs)])[0]
    assert code == 0
    subprocess.run(["bash", "-n", str(script)], check=True)
    env = {**os.environ, "PATH": f"{STUBS}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "127.0.0.1", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # Run from elsewhere: the script names every path and the runner it starts absolutely.
    done = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path / "runs", capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [run_dir] = runs.iterdir()
    for rank in (0, 1):
        events = read_events(run_dir / "events" / f"rank{rank}.jsonl")
        assert [e["node_rank"] for e in events if e.get("event") == "start"] == [rank]
        assert [e["step"] for e in events if "event" not in e] == [1, 2, 3, 4]
    [path] = recs.glob("*.json")
    rec = records.load(path)
    assert path.stem == run_dir.name and records.verify(path)[0]
    assert rec["status"] == "succeeded" and set(rec["metrics"]["loss_curve"]) == {"0", "1"}
    assert rec["launch"]["scheduler"] == {"name": "slurm", "job_id": "4242", "nodes": "127.0.0.1", "node_count": 2,
                                          "restart_count": 0, "cluster": None}
    assert rec["launch"]["job"]["target"] == "slurm" and rec["launch"]["nodes"] == 2
    capsys.readouterr()
    code, out, _ = run_cli(["replay", str(path)], capsys)
    assert code == 0 and f"runner job {path} --to slurm --port " in out and f"sbatch {run_dir.name}-rerun.sh" in out
