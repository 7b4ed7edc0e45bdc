"""Bad input to `runner run` stops before anything is written (exit 2, one line with the fix); files keep the
user's umask; the supervisor's control lines are read whole, once, and only by the launch they were sent to."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from runner.events.paths import RunPaths
from runner.launch.supervisor import Supervisor, read_requests, send_request
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


class _Active:
    """What a supervisor drives, short of torchrun: it runs until told how to stop, or ends by itself (exit 0)
    after a few polls, so that a request the supervisor does not take fails the test instead of hanging it."""

    def __init__(self):
        self.stopped: tuple[str, str | None, str] | None = None
        self.stop_reason: dict = {}
        self.polls = 0

    def poll(self):
        self.polls += 1
        return 0 if self.polls > 4 else None

    def stop(self, signal_name, cause):
        self.stopped = ("stop", signal_name, cause)

    def cancel(self, signal_name, cause):
        self.stopped = ("cancel", signal_name, cause)

    def wait(self):
        return 143 if self.stopped else 0


def _supervisor(run_dir: Path, node: int, nodes: int) -> Supervisor:
    return Supervisor(run_dir, {"node_rank": node, "spec": {"hardware": {"nodes": nodes}}})


def test_a_new_attempt_ignores_the_requests_that_stopped_the_last(tmp_path: Path):
    # A requeued two-node job: node 1 starts again before node 0 and reads the one control file, which still
    # holds the preemption of the attempt before (it used to stop node 1 alone, leaving node 0 in the rendezvous).
    paths = RunPaths(tmp_path)
    send_request(paths, "preempt", "SIGUSR1", "SIGUSR1 to runner run")
    sup, active = _supervisor(tmp_path, 1, 2), _Active()
    send_request(paths, "stop", "SIGTERM", "SIGTERM to runner run")  # this attempt's own
    assert sup._watch(active) == 143
    assert active.stopped == ("stop", "SIGTERM", "stopped")
    assert sup.state["stopping"] == {"request": "stop", "signal": "SIGTERM", "by": "SIGTERM to runner run"}


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_signal_to_one_nodes_supervisor_stops_every_node(nodes, tmp_path: Path):
    paths = RunPaths(tmp_path)
    node0, node1 = _supervisor(tmp_path, 0, nodes), _supervisor(tmp_path, 1, nodes)
    node1.on_signal(signal.SIGUSR1, None)  # only node 1's processes were signalled
    active1 = _Active()
    assert node1._watch(active1) == 143 and active1.stopped == ("stop", "SIGUSR1", "preempted")
    reqs, _ = read_requests(paths)
    if nodes == 1:
        assert reqs == []  # nobody else to tell
        return
    assert [(r["request"], r["signal"], r["by"]) for r in reqs] == [
        ("preempt", "SIGUSR1", "SIGUSR1 to node 1's supervisor")]
    active0 = _Active()
    assert node0._watch(active0) == 143 and active0.stopped == ("stop", "SIGUSR1", "preempted")
    assert read_requests(paths)[0] == reqs  # node 0 took the request; it sent none of its own


def test_a_node_that_starts_late_takes_its_own_attempts_early_stop(tmp_path: Path, monkeypatch):
    # Under SLURM each request names its attempt (job id and restart count): node 1, starting after node 0's view
    # already passed on this attempt's preemption, takes it; the previous attempt's stays ignored.
    paths = RunPaths(tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    send_request(paths, "preempt", "SIGUSR1", "the last attempt's")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    send_request(paths, "stop", "SIGTERM", "this attempt's, before node 1 started")
    sup, active = _supervisor(tmp_path, 1, 2), _Active()
    assert sup._watch(active) == 143 and active.stopped == ("stop", "SIGTERM", "stopped")
    assert sup.state["stopping"]["by"] == "this attempt's, before node 1 started"
    # Outside a scheduler that numbers its attempts nothing written before the start is taken.
    monkeypatch.delenv("SLURM_JOB_ID")
    later = _supervisor(tmp_path, 1, 2)
    send_request(paths, "cancel", "SIGINT", "after the start")
    assert later._watch(_Active()) == 143 and later.state["stopping"]["by"] == "after the start"
