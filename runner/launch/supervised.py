"""A view's handle on a supervised run: start the supervisor detached, follow it through the run folder, send it
requests, and finish the record of a run whose supervisor is gone."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

from runner.errors import EXIT_FAILED, UserError
from runner.events.monitor import RunView
from runner.events.paths import RunPaths
from runner.launch.handle import run_view
from runner.launch.process import ranks_alive
from runner.launch.supervisor import (EXIT_CANCELLED, finish_unfinished, log_path, read_state, send_request,
                                      state_path)
from runner.record import records

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 600.0  # pins (hashing the model and data) come before torchrun starts


class SupervisorFailed(Exception):
    """The supervisor could not launch the run (its message and log say why)."""


class SupervisedRun:
    """The view side of a run: a RunHandle, as an in-process ActiveRun is (poll, view, cancel, stop, wait, finish)."""

    def __init__(self, paths: RunPaths, spec: Any = None, proc: subprocess.Popen[bytes] | None = None,
                 node: int = 0):
        self.paths = paths
        self.node = node
        self.run_id = paths.run_dir.name
        self.spec = spec
        self.proc = proc
        self.requested: str | None = None
        self.state: dict[str, Any] = read_state(paths, node) or {}
        self.record: dict[str, Any] | None = None
        self.lost = False  # the supervisor died before finishing (poll finished its record as failed)

    @property
    def record_path(self) -> Path | None:
        path = self.state.get("record")
        return Path(path) if path else None

    @property
    def pid(self) -> int | None:
        """The supervisor's pid: the root of the run's process tree on this node."""
        return self.proc.pid if self.proc is not None else self.state.get("pid")

    @property
    def cancelled(self) -> bool:
        if self.requested is not None:
            return True
        return self.state.get("status") == "cancelled" or "stopping" in self.state

    @property
    def ended(self) -> bool:
        return self.state.get("state") == "finished"

    def refresh(self) -> dict[str, Any]:
        self.state = read_state(self.paths, self.node) or self.state
        return self.state

    def poll(self) -> int | None:
        """The run's exit code once the supervisor finished (or was lost), else None."""
        if self.proc is not None:
            self.proc.poll()  # reaps our child, so that a dead supervisor is not a zombie that looks alive
        state = self.refresh()
        if state.get("state") == "finished":
            self._reap(state)
            return int(state.get("exit_code", EXIT_FAILED))
        if not supervisor_alive(state, self.proc) and not ranks_alive(self.paths):
            state = self.refresh()  # it may have finished between the two reads
            if state.get("state") == "finished":
                return int(state.get("exit_code", EXIT_FAILED))
            finish_lost(self.paths, state)
            self.lost = True
            return EXIT_FAILED
        return None

    def view(self, clock: Callable[[], float] = time.time) -> RunView:
        return run_view(self.paths, clock)

    def _reap(self, state: dict[str, Any], timeout_s: float = 30.0) -> None:
        """The supervisor has said its last word and is exiting: wait for it, so that once a view reports the end
        no process of the run is left."""
        import psutil

        try:
            if self.proc is not None:
                self.proc.wait(timeout_s)
            elif state.get("host") == socket.gethostname() and supervisor_alive(state):
                psutil.Process(int(state["pid"])).wait(timeout_s)
        except (subprocess.TimeoutExpired, psutil.Error, KeyError, ValueError):
            pass

    def request(self, kind: str, signal_name: str | None, by: str) -> None:
        self.requested = self.requested or kind
        send_request(self.paths, kind, signal_name, by)

    def cancel(self, signal_name: str | None = None, by: str = "sft-tui") -> None:
        self.request("cancel", signal_name, by)

    def stop(self, signal_name: str | None = None, by: str = "sft-tui") -> None:
        self.request("stop", signal_name, by)

    def wait(self, interval_s: float = 0.2) -> int:
        while (code := self.poll()) is None:
            time.sleep(interval_s)
        return code

    def finish(self, _code: int | None = None) -> dict[str, Any] | None:
        """The record as the supervisor finished it (the supervisor owns it: nothing is written here)."""
        path = self.record_path
        if path is not None and path.is_file():
            self.record = records.load(path)
        return self.record


def supervisor_alive(state: dict[str, Any], proc: subprocess.Popen[bytes] | None = None) -> bool:
    """Whether the supervisor that wrote `state` still runs. On another host it cannot be told: assumed alive."""
    import psutil

    if proc is not None:
        return proc.poll() is None
    if not state or state.get("host") != socket.gethostname():
        return bool(state)
    try:
        p = psutil.Process(int(state["pid"]))
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        created = state.get("create_time")
        return created is None or abs(p.create_time() - float(created)) < 1.0  # not a reused pid
    except (psutil.Error, KeyError, ValueError, TypeError):
        return False


def spawn(spec: Any, runs_dir: Path, records_dir: Path, estimate: dict[str, Any] | None = None,
          replay_of: str | None = None, node_rank: int = 0, run_id: str | None = None,
          resume: bool = False, decisions: Any = None) -> SupervisedRun:
    """Start the run's supervisor apart from this process (own session, no terminal, SIGHUP ignored) and return
    once it has launched torchrun; raise SupervisorFailed when it could not. The run's spec and decisions are
    written here, once (`prepare_run`; `decisions`: a replay's recorded ones), and the supervisor reads them."""
    from runner.launch.command import check_run_target, new_run_id, prepare_run
    from runner.launch.process import ignore_preemption_warning
    from runner.record.pins import torch_pins

    check_run_target(runs_dir, records_dir, run_id)
    if run_id is None:
        run_id = new_run_id(spec.name, runs_dir, records_dir)
    paths = RunPaths(runs_dir / run_id)
    spec, _ = prepare_run(paths, spec, decisions)
    # A resumed run's previous supervisor said its last word. (The requests it got stay in `control`: the new
    # supervisor reads from the file's end, and another node's may already be reading it.)
    state_path(paths, node_rank).unlink(missing_ok=True)
    request = {"spec": spec.to_dict(), "runs_dir": str(runs_dir), "records_dir": str(records_dir),
               "estimate": estimate, "replay_of": replay_of, "node_rank": node_rank, "resume": resume,
               # Taken here, where the gate imported torch already: the supervisor then starts without it.
               "torch_pins": torch_pins() if node_rank == 0 and not resume else None}
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(log_path(paths, node_rank), "ab") as log:
        # The request goes through a pipe, not a file: the spec as given may hold credentials (redacted on disk).
        proc = subprocess.Popen([sys.executable, "-m", "runner.launch.supervisor", str(paths.run_dir)],
                                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=ignore_preemption_warning)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(request).encode())
    proc.stdin.close()
    run = SupervisedRun(paths, spec, proc, node_rank)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        state = run.refresh()
        if state.get("state") in ("running", "finished") or proc.poll() is not None:
            break
        time.sleep(0.05)
    state = run.refresh()
    if state.get("error") or (proc.poll() is not None and state.get("state") != "finished"):
        raise SupervisorFailed(f"run {run_id} did not start: {state.get('error') or 'the supervisor exited'} "
                               f"(log: {log_path(paths, node_rank)})")
    return run


def attach(run_ref: str, runs_dir: Path) -> SupervisedRun:
    """A view of an existing run: `run_ref` is a run id under runs_dir or a run folder."""
    as_path = Path(run_ref)
    run_dir = as_path if (as_path / "spec.json").is_file() else runs_dir / run_ref
    paths = RunPaths(run_dir)
    if not paths.spec.is_file():
        raise UserError(f"no run '{run_ref}' in {runs_dir} (expected a run id from `runner list`, or a run folder)")
    if read_state(paths) is None:
        raise UserError(f"run '{run_ref}' has no supervisor.json: it was not started by a supervisor "
                        "(in-process bench runs cannot be attached)")
    return SupervisedRun(paths)


def finish_lost(paths: RunPaths, state: dict[str, Any]) -> dict[str, Any] | None:
    """Finish the record of a run whose supervisor died before finishing it: `failed`, "supervisor lost", with
    the steps the events show. Returns the record written, or None when there was nothing to finish."""
    from runner.launch.reserve import DiskReserve

    path = Path(state["record"]) if state.get("record") else None
    if path is None:
        return None
    # The dead supervisor's reserve (runner.launch.reserve) is the room the record needs on a full disk.
    DiskReserve(paths.run_dir, path.parent).release(all_files=True)
    try:
        return finish_unfinished(paths, path, "supervisor lost",
                                 f"the supervisor (pid {state.get('pid')} on {state.get('host')}) died before "
                                 "finishing the record (killed, e.g. by the OOM killer or SIGKILL)",
                                 lost={"supervisor_pid": state.get("pid"), "host": state.get("host")})
    except OSError as e:
        raise UserError(f"could not finish the record {path} of the lost run {paths.run_dir.name}: {e.strerror}; "
                        f"free space there, then `runner list --records-dir {path.parent}` finishes it") from None


def reap_lost(records_dir: Path) -> list[str]:
    """Finish, as `failed`, every running record in records_dir whose supervisor on this host is gone; their ids."""
    done = []
    for path in sorted(records_dir.glob("*.json")):
        try:
            rec = records.load(path)
        except records.RecordError:
            continue
        if rec.get("status") != "running" or not rec.get("run_dir"):
            continue
        paths = RunPaths(Path(rec["run_dir"]))
        state = read_state(paths)
        if state is None or supervisor_alive(state) or ranks_alive(paths):
            continue
        if state.get("state") == "finished":  # it said its last word, yet the record is open: it failed to launch
            if finish_unfinished(paths, path, "launch failed", state.get("error") or "the supervisor could not "
                                 "launch the run") is not None:
                done.append(rec["id"])
            continue
        if finish_lost(paths, {**state, "record": str(path)}) is not None:
            done.append(rec["id"])
    return done


def is_live(rec: dict[str, Any]) -> bool:
    """A `running` record whose supervisor still runs (on this host, or on another one that cannot be asked)."""
    if rec.get("status") != "running" or not rec.get("run_dir"):
        return False
    state = read_state(RunPaths(Path(rec["run_dir"])))
    return state is not None and state.get("state") != "finished" and supervisor_alive(state)


def live_runs(records_dir: Path) -> list[dict[str, Any]]:
    """Records whose run is still going under a supervisor (after reaping the lost ones)."""
    reap_lost(records_dir)
    return [r for r in records.list_records(records_dir) if is_live(r)]


__all__ = ["EXIT_CANCELLED", "SupervisedRun", "SupervisorFailed", "attach", "finish_lost", "is_live", "live_runs",
           "reap_lost", "spawn", "supervisor_alive"]
