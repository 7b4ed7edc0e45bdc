"""A full disk on a real tmpfs: a run whose checkpoints cannot fit is refused before launch; forced, it ends
`failed` with cause "disk full", its record finished and verified, no process left and no traceback; once the
filesystem is enlarged, `--resume` finishes it on the uninterrupted run's loss curve."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from runner.record import records
from tests.conftest import dir_args, last_json, run_cli
from tests.procs import process_tree, start_runner, wait_all_gone, wait_for_step

pytestmark = pytest.mark.dist

# Three checkpoints of the embedded model (3.4 MB each): 6 MiB holds the first (with the supervisor's 1 MiB
# reserve and the events) and fills up during the second.
SETS = ["--set", "train.max_steps=12", "--set", "train.checkpoint_every=4"]


@pytest.fixture
def small_fs(tmp_path: Path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here: a real small filesystem cannot be made")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({made.stderr.strip()}): needs root or CAP_SYS_ADMIN")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_is_refused_then_fails_cleanly_and_resumes_on_the_same_curve(small_fs, tiny_run, capsys):
    folders = {"runs": small_fs / "runs", "records": small_fs / "records"}
    code, out, err = run_cli(["run", "tiny-cpu", *SETS, "--plain", *dir_args(folders)], capsys)
    line = err.strip().splitlines()[-1]
    assert code == 2 and line.startswith(f"error: not enough disk in {small_fs}:"), err
    assert "3 checkpoint(s)" in line and "free" in line and "--force" in line and "Traceback" not in err
    assert not folders["runs"].exists()  # refused before anything was written

    proc = start_runner(["run", "tiny-cpu", *SETS, "--force", "--plain", "--json", *dir_args(folders)])
    run_dir, _ = wait_for_step(folders["runs"], 2)
    procs = process_tree(proc.pid)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    wait_all_gone(procs, 30)
    path = Path(last_json(out)["record"])
    rec = records.load(path)
    failure = rec["failure"]
    assert rec["status"] == "failed" and failure["cause"] == "disk full" and records.verify(path)[0]
    assert f"no space left on the filesystem of {run_dir}" in failure["message"] and "free" in failure["message"]
    assert f"disk full: no space left on the filesystem of {run_dir}" in err
    # The checkpoint the disk could not hold stays hidden; the one before it is the one resumed from.
    assert [p.name for p in sorted((run_dir / "checkpoints").iterdir()) if not p.name.startswith(".")] == ["step4"]

    subprocess.run(["mount", "-o", "remount,size=32m", str(small_fs)], check=True)
    code, out, err = run_cli(["run", "--resume", str(run_dir), "--plain", "--json", "--records-dir",
                              str(folders["records"])], capsys)
    assert code == 0, err
    resumed = records.load(path)
    assert resumed["status"] == "succeeded" and resumed["resumes"][-1]["from_step"] == 4 and records.verify(path)[0]
    # The shared uninterrupted run has the same spec but for its checkpoints, which change nothing it learns.
    whole = records.load(tiny_run["record"])
    assert {**resumed["spec"]["train"], "checkpoint_every": 0} == {**whole["spec"]["train"], "checkpoint_every": 0}
    assert resumed["metrics"]["loss_curve"] == whole["metrics"]["loss_curve"]
