"""One run from spec to record: allocate the id, write the running record, launch, watch, finish the record."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from runner.record import pins as pins_mod
from runner.record import records
from runner.facts.catalog import load_arch
from runner.events.failure import any_error_event, diagnose, missing_loss  # noqa: F401 (diagnose: runner.launch.run.diagnose for callers)
from runner.facts.flops import attention_flops_per_doc_len_sq, model_flops_per_token
from runner.facts.gpus import ceiling_tflops_here
from runner.launch.process import Launcher, ranks_alive
from runner.launch.reserve import disk_full_failure
from runner.events.monitor import RunView
from runner.events.paths import RunPaths
from runner.launch.handle import run_view
from runner.launch.command import build_command, command_line, new_run_id, prepare_run, run_env
from runner.launch.sampler import NodeSampler
from runner.errors import EXIT_CANCELLED, EXIT_STOPPED
from runner.launch.scheduler import job_facts, scheduler_facts
from runner.spec import RunSpec
from runner.writes import atomic_write_text
from runner.events.tracking import Trackers, open_trackers

REPO_DIR = Path(__file__).resolve().parent.parent
# How long a record waits for the ranks of a killed torchrun: they stop within runner.train.runtime's grace (20 s).
RANKS_GONE_S = 30.0


@dataclass
class ActiveRun:
    """A launched run on this node, run from this process (a RunHandle); node 0 owns the record."""

    run_id: str
    spec: RunSpec
    paths: RunPaths
    record_path: Path | None
    record: dict[str, Any] | None
    launcher: Launcher
    sampler: NodeSampler | None = None
    started: float = field(default_factory=time.time)
    trackers: Trackers | None = None
    # Why the run was stopped early (None: it was not): the signal or request, and the cause the record names.
    stop_reason: dict[str, Any] | None = None
    # Bytes free on the run folder's filesystem when the ranks stopped (the supervisor measures it before giving
    # back its reserve): a run that failed with almost none left failed of a full disk.
    free_at_end: int | None = None

    @property
    def cancelled(self) -> bool:
        return self.launcher.cancelled

    @property
    def ended(self) -> bool:
        return self.launcher.poll() is not None

    def poll(self) -> int | None:
        return self.launcher.poll()

    def view(self, clock: Callable[[], float] = time.time) -> RunView:
        return run_view(self.paths, clock)

    def cancel(self, signal_name: str = "SIGINT", cause: str = "cancelled") -> None:
        """Stop at the next step boundary without a checkpoint beyond those train.checkpoint_every writes."""
        self.stop_reason = self.stop_reason or {"signal": signal_name, "cause": cause}
        self.launcher.cancel()
        self.stop_sampler()

    def stop(self, signal_name: str = "SIGTERM", cause: str = "stopped") -> None:
        """Stop at the next step boundary with an emergency checkpoint, so the run can be resumed."""
        self.stop_reason = self.stop_reason or {"signal": signal_name, "cause": cause}
        self.launcher.stop()
        self.stop_sampler()

    def wait(self) -> int:
        code = self.launcher.wait()
        if code < 0:
            # torchrun was killed: its ranks got SIGTERM (PR_SET_PDEATHSIG) and may still be writing their last
            # step and checkpoint, which the record must count.
            _wait_ranks_gone(self.paths, RANKS_GONE_S)
        self.stop_sampler()
        return code

    def stop_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None

    def finish(self, exit_code: int) -> dict[str, Any] | None:
        """Finish the record from the event files (idempotent for status, metrics and failure)."""
        self.stop_sampler()
        if self.record is None or self.record_path is None:
            return None
        rec = dict(self.record)
        h = self.spec.hardware
        rec["metrics"] = records.metrics_from_events(self.paths.events, self.spec.world_size, h.device,
                                                     _run_flops(self.spec))
        # A resumed run's wall time covers every launch, as its train_s does (each launch's end event adds its own).
        before = ((rec.get("resumes") or [{}])[-1]).get("wall_s_before") or 0.0
        rec["metrics"]["wall_s"] = round(time.time() - self.started + before, 3)
        quantization = records.quantization_from_events(self.paths.events)
        if quantization:
            rec["quantization"] = quantization
        rec["finished"] = records.now_iso()
        if self.launcher.cancelled:
            rec["status"] = "cancelled"
            rec["cancel"] = {**(self.stop_reason or {"signal": None, "cause": "cancelled"}),
                             **resume_hint(self.paths.run_dir), "launcher_exit": exit_code}
            # The run's exit as its supervisor and view end (torchrun's own, whatever a signal made it, kept above).
            exit_code = EXIT_STOPPED if self.launcher.graceful else EXIT_CANCELLED
        elif exit_code == 0 and not any_error_event(self.paths, self.spec.world_size):
            silent = missing_loss(self.paths, self.spec.world_size, exit_code)
            rec["status"] = "failed" if silent else "succeeded"
            if silent:
                rec["failure"] = silent
        else:
            rec["status"] = "failed"
            rec["failure"] = disk_full_failure(diagnose(self.paths, self.spec.world_size, exit_code), self.paths,
                                               self.free_at_end)
        rec["exit_code"] = exit_code
        if self.trackers is not None:
            self.trackers.stop()
            self.trackers.update()
            rec["trackers"] = self.trackers.idents
        self.record = records.save(self.record_path, rec)
        if self.trackers is not None:
            # After the lock: the artifact is the record as it stays.
            trackers, self.trackers = self.trackers, None
            trackers.finish(self.record_path, rec["status"])
        return self.record


def _wait_ranks_gone(paths: RunPaths, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while ranks_alive(paths) and time.monotonic() < deadline:
        time.sleep(0.2)


def resume_hint(run_dir: Path) -> dict[str, Any]:
    """Whether a stopped run can be resumed, from which checkpoint, and the command that does it."""
    done = RunPaths(run_dir).complete_checkpoints()
    if not done:
        return {"resumable": False, "checkpoint_step": None, "checkpoint": None, "resume": None}
    step, path = done[-1]
    return {"resumable": True, "checkpoint_step": step, "checkpoint": str(path),
            "resume": f"runner run --resume {run_dir}"}


def _run_flops(spec: RunSpec) -> records.RunFlops | None:
    """The model's FLOPs counts and this machine's GPU ceiling, for the record's MFU; None on CPU."""
    ceiling = ceiling_tflops_here(spec.hardware.device)
    if ceiling is None:
        return None
    try:
        arch = load_arch(spec).arch
    except Exception:  # noqa: BLE001 - an architecture the catalog cannot read only loses the MFU figure
        return None
    return records.RunFlops(model_flops_per_token(arch), attention_flops_per_doc_len_sq(arch), ceiling)


def start(spec: RunSpec, runs_dir: Path, records_dir: Path, estimate: dict[str, Any] | None = None,
          replay_of: str | None = None, node_rank: int = 0, run_id: str | None = None,
          resume: bool = False, stop_with_parent: bool = False, decisions: Any = None,
          torch_pins: dict[str, Any] | None = None) -> ActiveRun:
    """Create the run directory and (on node 0) the running record, then launch torchrun. `torch_pins`: taken
    already by the process that asked for the launch (runner.record.pins.torch_pins).

    With resume, the run id is an existing run: its record is reopened as running (the launch is appended to
    `resumes`) and the ranks continue from the latest complete checkpoint."""
    if run_id is None:
        run_id = new_run_id(spec.name, runs_dir, records_dir)
    paths = RunPaths(runs_dir / run_id)
    spec, decided = prepare_run(paths, spec, decisions)
    argv = build_command(spec, paths.spec, run_id, node_rank, resume)
    env = run_env()
    record_path = None
    rec = None
    if node_rank == 0 and resume and (records_dir / f"{run_id}.json").exists():
        record_path = records_dir / f"{run_id}.json"
        rec = records.load(record_path)
        rec.pop("lock", None)
        hint = resume_hint(paths.run_dir)
        rec["resumes"] = [*rec.get("resumes", []), {"at": records.now_iso(), "argv": argv,
                                                    "after_step": (rec.get("metrics") or {}).get("steps"),
                                                    "from_step": hint["checkpoint_step"],
                                                    "checkpoint": hint["checkpoint"],
                                                    "previous_status": rec.get("status"),
                                                    "wall_s_before": _wall_before(rec.get("metrics") or {}),
                                                    "scheduler": scheduler_facts()}]
        rec.pop("cancel", None)
        rec.update(status="running", finished=None, failure=None, spec=spec.to_dict(), decisions=decided.to_dict())
        rec = records.save(record_path, rec)
    elif node_rank == 0:
        pins = pins_mod.capture(spec, REPO_DIR, torch_pins)
        diff = pins["git"].pop("diff", "")
        if diff:
            # Beside the record (records/<id>.diff), so the pair travels together; its sha256 is in the record.
            diff_path = records_dir / f"{run_id}.diff"
            atomic_write_text(diff_path, diff)
            pins["git"]["diff_file"] = diff_path.name
        launch = {"argv": argv, "command": command_line(argv), "world_size": spec.world_size,
                  "nodes": spec.hardware.nodes, "nproc_per_node": spec.hardware.nproc_per_node,
                  "env": pins_mod.relevant_env(env), "scheduler": scheduler_facts(), "job": job_facts()}
        record_path = records_dir / f"{run_id}.json"
        rec = records.save(record_path, {**records.new_record(run_id, spec.to_dict(), pins, launch, estimate,
                                                                paths.run_dir, replay_of),
                                         "decisions": decided.to_dict()})
    trackers = open_trackers(spec, run_id, paths.run_dir) if node_rank == 0 else None
    if trackers is not None and rec is not None and record_path is not None:
        rec = records.save(record_path, {**rec, "trackers": trackers.idents})
    launcher = Launcher(argv, paths, env, stop_with_parent=stop_with_parent)
    launcher.start()
    if trackers is not None:
        trackers.start()  # their own thread: the watching loop (dashboard or headless) never waits on a tracker
    sampler = NodeSampler(paths.run_dir, node_rank, spec.hardware.sample_interval_s)
    sampler.start()
    return ActiveRun(run_id, spec, paths, record_path, rec, launcher, sampler, trackers=trackers)


class _Terminated(Exception):
    """SIGTERM reached the process that runs torchrun in-process (`runner bench`): a graceful stop follows."""


def _raise_terminated(_signum: int, _frame: object) -> None:
    raise _Terminated


def watch(run: ActiveRun, on_tick: Callable[[], None] | None = None, interval_s: float = 0.5) -> int:
    """Wait for the run, calling on_tick between polls; Ctrl-C cancels the run cleanly and returns 130; SIGTERM
    (`timeout`, a scheduler) stops it with a checkpoint, finishes nothing itself and returns 143."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        while run.poll() is None:
            if on_tick:
                on_tick()
            time.sleep(interval_s)
        code = run.wait()
    except KeyboardInterrupt:
        run.cancel()
        code = EXIT_CANCELLED
    except _Terminated:
        run.stop("SIGTERM", "stopped")
        code = EXIT_STOPPED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if on_tick:
        on_tick()
    return code


def _wall_before(metrics: dict[str, Any]) -> float:
    """The wall time of a run's launches so far: its record's wall_s, at least their train_s (a record finished
    without a wall time, e.g. by a lost supervisor's reaper, still trained that long)."""
    return max(float(metrics.get("wall_s") or 0.0), float(metrics.get("train_s") or 0.0))
