"""The run's supervisor: a process in a session of its own, apart from any terminal, that owns torchrun, the node
sampler, trackers and the record, and always finishes the record. Views attach to it through the run folder.

Started by `runner.launch.supervised.spawn` as `python -m runner.launch.supervisor RUN_DIR`, with the launch
request (spec, folders, estimate, ...) as one JSON object on stdin. It writes `RUN_DIR/supervisor.json` (pid,
host, state; exit code and status once finished) and reads requests from `RUN_DIR/control`.

Signals, as schedulers mean them: SIGTERM is a graceful stop (the ranks checkpoint at the next step boundary,
record `cancelled`, exit 143); SIGUSR1 (SLURM's warning before the time limit) the same with the cause
"preempted"; SIGINT a cancel (exit 130); SIGHUP is ignored: no terminal owns the run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from runner.errors import EXIT_CANCELLED, EXIT_STOPPED
from runner.events.paths import RunPaths
from runner.record.records import now_iso
from runner.writes import atomic_write_json

POLL_S = 0.5
# What each request does: (how the ranks stop, the cause the record names, the exit code).
REQUESTS = {
    "cancel": ("cancel", "cancelled", EXIT_CANCELLED),
    "stop": ("stop", "stopped", EXIT_STOPPED),
    "preempt": ("stop", "preempted", EXIT_STOPPED),
}
SIGNAL_REQUESTS = {signal.SIGINT: "cancel", signal.SIGTERM: "stop", signal.SIGUSR1: "preempt"}
SIGNALLED = "signal to the supervisor"


def state_path(paths: RunPaths, node: int = 0) -> Path:
    """Node 0's supervisor.json; every other node of a run (one shared run folder) has its own."""
    return paths.supervisor if node == 0 else paths.run_dir / f"supervisor-node{node}.json"


def log_path(paths: RunPaths, node: int = 0) -> Path:
    return paths.supervisor_log if node == 0 else paths.logs / f"supervisor-node{node}.log"


def read_state(paths: RunPaths, node: int = 0) -> dict[str, Any] | None:
    """supervisor.json, or None when there is none (yet) or it cannot be read."""
    try:
        data = json.loads(state_path(paths, node).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_requests(paths: RunPaths, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Complete control lines after `offset`, and the offset after them."""
    try:
        with open(paths.control, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    out = []
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if isinstance(req, dict) and req.get("request") in REQUESTS:
            out.append(req)
    return out, offset + end


def attempt_tag() -> str | None:
    """This launch's attempt as every node of it sees it, where a scheduler numbers its restarts (SLURM: the job
    id and restart count); None elsewhere."""
    from runner.launch.scheduler import scheduler_facts

    facts = scheduler_facts()
    if not facts or "restart_count" not in facts:
        return None
    return f"{facts['name']}:{facts['job_id']}:{facts['restart_count']}"


def control_end(paths: RunPaths) -> int:
    """Where the requests of a launch starting now begin: the control file outlives attempts (a resumed run, a
    requeued job), and what an earlier attempt was asked is not for this one."""
    try:
        return paths.control.stat().st_size
    except FileNotFoundError:
        return 0


def send_request(paths: RunPaths, request: str, signal_name: str | None, by: str) -> None:
    """Append one request line (a single write: lines from several views never interleave)."""
    line = json.dumps({"request": request, "signal": signal_name, "by": by, "t": time.time(),
                       "attempt": attempt_tag()}) + "\n"
    fd = os.open(paths.control, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def finish_unfinished(paths: RunPaths, path: Path, cause: str, message: str,
                      **extra: Any) -> dict[str, Any] | None:
    """Finish a record still `running` whose run is over (its supervisor died, or could not launch): `failed`
    with `cause`, the steps the events show, and whether a checkpoint allows a resume. None when it was finished."""
    from runner.launch.run import resume_hint
    from runner.record import records

    if not path.is_file():
        return None
    rec = records.load(path)
    if rec.get("status") != "running":
        return None
    world_size = int((rec.get("launch") or {}).get("world_size") or 1)
    device = ((rec.get("spec") or {}).get("hardware") or {}).get("device") or "cpu"
    metrics = records.metrics_from_events(paths.events, world_size, device)
    last_steps = {r: info.get("last_step") for r, info in (metrics.get("per_rank") or {}).items()}
    rec.pop("lock", None)
    rec.pop("cancel", None)
    rec.update(status="failed", finished=now_iso(), metrics=metrics, failure={
        "rank": None, "cause": cause, "message": message, "last_step": metrics.get("steps") or 0,
        "last_steps": last_steps, "log": str(paths.supervisor_log)})
    rec["lost"] = {**extra.get("lost", {}), **resume_hint(paths.run_dir)}
    return records.save(path, rec)


class Supervisor:
    """One run on this node, from the launch request to the finished record."""

    def __init__(self, run_dir: Path, request: dict[str, Any]):
        self.paths = RunPaths(run_dir)
        self.request = request
        self.state: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname(), "started": now_iso(),
                                      "create_time": _create_time(os.getpid()), "state": "starting",
                                      "run_id": run_dir.name, "node_rank": request.get("node_rank", 0)}
        self.pending: dict[str, Any] | None = None  # the first request wins; later ones change nothing
        # Not 0: every node of a run reads the one control file, and a node may start before node 0 (or after the
        # previous attempt's requests): those requests stopped that attempt, not this one. Those written before
        # this node started but tagged with this very attempt (a scheduler's restart count: a preemption that
        # reached node 0's view while this node was still starting) are for it.
        self._control_offset = control_end(self.paths)
        tag = attempt_tag()
        self._early = [] if tag is None else [
            req for req in read_requests(self.paths)[0] if req.get("attempt") == tag]

    def write_state(self, **changes: Any) -> None:
        self.state.update(changes)
        atomic_write_json(state_path(self.paths, self.state["node_rank"]), self.state)

    def on_signal(self, signum: int, _frame: object) -> None:
        if self.pending is None:
            self.pending = {"request": SIGNAL_REQUESTS[signum], "signal": signal.Signals(signum).name,
                            "by": SIGNALLED}

    def run(self) -> int:
        from runner.launch import run as run_mod
        from runner.spec import validate

        from runner.launch.reserve import DiskReserve
        from runner.gate.disk import free_bytes

        r = self.request
        self.write_state()
        # Held from the start, given back to finish the record: a full disk then ends the run `failed`, not
        # `running` forever with no room for its record.
        reserve = DiskReserve(self.paths.run_dir, Path(r["records_dir"]))
        reserve.hold()
        try:
            active = run_mod.start(validate(r["spec"]), Path(r["runs_dir"]), Path(r["records_dir"]),
                                   estimate=r.get("estimate"), replay_of=r.get("replay_of"),
                                   node_rank=r.get("node_rank", 0), run_id=self.paths.run_dir.name,
                                   resume=r.get("resume", False), stop_with_parent=True,
                                   torch_pins=r.get("torch_pins"))
        except Exception as e:  # noqa: BLE001 - the view shows it; nothing was launched
            reserve.release()
            error = f"{type(e).__name__}: {e}"
            record = Path(r["records_dir"]) / f"{self.paths.run_dir.name}.json"
            if r.get("node_rank", 0) == 0:
                finish_unfinished(self.paths, record, "launch failed", error)
            self.write_state(state="finished", exit_code=1, status="failed", error=error,
                             record=str(record) if record.is_file() else None)
            raise
        self.write_state(state="running", record=str(active.record_path) if active.record_path else None,
                         torchrun_pid=active.launcher.pid)
        code = self._watch(active)
        active.free_at_end = free_bytes(self.paths.run_dir)[1]
        reserve.release()
        rec = active.finish(code)
        # A node other than 0 keeps no record: its own status says how its part ended.
        status = (rec or {}).get("status") or ("cancelled" if active.cancelled else "succeeded" if code == 0
                                               else "failed")
        if active.stop_reason is not None:
            code = REQUESTS[active.stop_reason["request"]][2]
        elif status != "succeeded" and code == 0:
            code = 1
        self.write_state(state="finished", exit_code=code, status=status, finished=now_iso())
        return code

    def _watch(self, active: Any) -> int:
        while True:
            code = active.poll()
            if code is not None:
                return active.wait()
            requests, self._control_offset = read_requests(self.paths, self._control_offset)
            requests, self._early = self._early + requests, []
            if self.pending is None and requests:
                self.pending = requests[0]
            if self.pending is not None:
                return self._stop(active, self.pending)
            time.sleep(POLL_S)

    def _stop(self, active: Any, req: dict[str, Any]) -> int:
        how, cause, _ = REQUESTS[req["request"]]
        node = self.state["node_rank"]
        if req.get("by") == SIGNALLED and int(self.request["spec"]["hardware"].get("nodes") or 1) > 1:
            # A signal that reached this node only (an operator's kill, a node-local agent) stops every node at
            # the same step: a node that stops alone leaves the others waiting in a collective.
            send_request(self.paths, req["request"], req.get("signal"), f"{req.get('signal')} to node {node}'s "
                         "supervisor")
        self.write_state(stopping={"request": req["request"], "signal": req.get("signal"), "by": req.get("by")})
        getattr(active, how)(req.get("signal"), cause)
        active.stop_reason.update(request=req["request"], by=req.get("by"))
        return active.wait()


def _create_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def main(argv: list[str]) -> int:
    run_dir = Path(argv[0])
    request = json.loads(sys.stdin.read())
    sup = Supervisor(run_dir, request)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    for signum in SIGNAL_REQUESTS:
        signal.signal(signum, sup.on_signal)
    return sup.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
