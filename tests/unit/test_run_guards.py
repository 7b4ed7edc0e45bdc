"""Bad input to `runner run` stops before anything is written (exit 2, one line with the fix); files keep the
user's umask; the supervisor's control lines are read whole."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from runner.events.paths import RunPaths
from runner.launch.supervisor import read_requests, send_request
from runner.writes import atomic_write_json
from tests.conftest import run_cli


def _nothing_written(tmp_path: Path, before: set[Path]) -> None:
    assert set(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("run_id", ["../../escape", "/abs/path", "a/b", "..", "x y", "-dash", "a..b"])
def test_unsafe_run_id_is_refused_before_anything_is_written(run_id, tmp_path: Path, capsys):
    before = set(tmp_path.rglob("*"))
    code, _, err = run_cli(["run", "tiny-cpu", f"--run-id={run_id}", "--runs-dir", str(tmp_path / "runs"),
                            "--records-dir", str(tmp_path / "records")], capsys)
    assert code == 2 and f"--run-id {run_id!r}" in err and "e.g. --run-id my-run-1" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    _nothing_written(tmp_path, before)


@pytest.mark.parametrize("which", ["--records-dir", "--runs-dir"])
def test_folder_that_cannot_be_written_is_refused(which, tmp_path: Path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    dirs = {"--runs-dir": str(tmp_path / "runs"), "--records-dir": str(tmp_path / "records")}
    dirs[which] = str(blocker / "sub")
    before = set(tmp_path.rglob("*"))
    code, _, err = run_cli(["run", "tiny-cpu", *[x for kv in dirs.items() for x in kv]], capsys)
    assert code == 2 and err.startswith(f"error: {which} {blocker / 'sub'}: {blocker} is a file, not a folder")
    assert len(err.strip().splitlines()) == 1
    _nothing_written(tmp_path, before)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere: permissions cannot refuse it")
def test_read_only_folder_is_refused(tmp_path: Path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    code, _, err = run_cli(["run", "tiny-cpu", "--records-dir", str(ro / "records"), "--runs-dir",
                            str(tmp_path / "runs")], capsys)
    assert code == 2 and "cannot write in" in err and not (tmp_path / "runs").exists()


def test_cpu_plan_that_does_not_fit_is_refused_unless_forced(tmp_path: Path, capsys):
    before = set(tmp_path.rglob("*"))
    code, _, err = run_cli(["run", "tiny-cpu", "--set", "train.seq_len=10000000", "--runs-dir",
                            str(tmp_path / "runs"), "--records-dir", str(tmp_path / "records")], capsys)
    assert code == 2 and "predicted not to fit" in err and "per rank (CPU memory)" in err and "--force" in err
    _nothing_written(tmp_path, before)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_records_are_written_with_the_umask(umask, mode, tmp_path: Path):
    old = os.umask(umask)
    try:
        atomic_write_json(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == mode


def test_control_lines_are_taken_whole_and_once(tmp_path: Path):
    paths = RunPaths(tmp_path)
    send_request(paths, "stop", "SIGTERM", "a test")
    with open(paths.control, "a") as f:
        f.write('{"request": "cancel"')  # a line still being written
    reqs, offset = read_requests(paths)
    assert [(r["request"], r["signal"], r["by"]) for r in reqs] == [("stop", "SIGTERM", "a test")]
    with open(paths.control, "a") as f:
        f.write(', "signal": null}\n{"request": "bogus"}\n')
    reqs, offset = read_requests(paths, offset)
    assert [r["request"] for r in reqs] == ["cancel"] and read_requests(paths, offset) == ([], offset)
