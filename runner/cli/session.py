"""Headless sessions: `runner run` and `runner replay` with a live display, shared by `sft-tui --headless`."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from runner import api
from runner.events.paths import RunPaths
from runner.record import records
from runner.launch.command import check_run_target
from runner.launch.handle import RunHandle
from runner.launch.supervised import SupervisedRun, SupervisorFailed
from runner.errors import EXIT_CANCELLED, EXIT_DETACHED, EXIT_FAILED, EXIT_NOT_REPRODUCED, EXIT_OK, UserError
from runner.record.replay import CPU_PIN, compare, folds, pinned_decisions, tolerance
from runner.spec import RunSpec, resolve


def gate_estimate(spec: RunSpec, force: bool, console: Console, runs_dir: Path,
                  from_step: int = 0) -> dict[str, Any] | None:
    """The launch gate (runner.api.gate: raises what refuses the run), its notes printed; returns the estimate
    the record keeps."""
    gate = api.gate(spec, force, runs_dir, from_step)
    for note in gate.notes:
        console.print(f"[yellow]{escape(note.text)}[/yellow]" if note.warning else escape(note.text), highlight=False)
    return gate.estimate


def launch_and_watch(spec: RunSpec, runs_dir: Path, records_dir: Path, plain: bool, console: Console,
                     estimate: dict[str, Any] | None = None, replay_of: str | None = None, node_rank: int = 0,
                     run_id: str | None = None, resume: bool = False,
                     decisions: Any = None) -> tuple[SupervisedRun, int]:
    """Start the run's supervisor (apart from this process and its terminal) and follow it to its end; `decisions`:
    a replay's recorded ones, which its ranks get whole."""
    from runner.cli.follow import ViewSignals, follow, say_detached

    # Signals are taken from before the start: a Ctrl+C while the supervisor hashes pins cancels the run it launches.
    with ViewSignals() as signals:
        try:
            active = api.launch(spec, runs_dir, records_dir, estimate=estimate, replay_of=replay_of,
                                node_rank=node_rank, run_id=run_id, resume=resume, decisions=decisions)
        except SupervisorFailed as e:
            raise UserError(str(e)) from None
        console.print(f"run {active.run_id}: {spec.world_size} rank(s) on {spec.hardware.device}; "
                      f"logs in {active.paths.logs}", highlight=False)
        followed = follow(active, console, plain, skip_existing=resume, signals=signals)
    if followed.detached:
        say_detached(console, active)
        return active, followed.code
    active.finish(followed.code)
    return active, followed.code


def _status_exit(rec: dict[str, Any] | None, code: int) -> int:
    if code == EXIT_DETACHED:
        return code
    if rec is None:  # a node other than 0: no record here, the supervisor's exit code says it all
        return EXIT_OK if code == 0 else code if code >= EXIT_CANCELLED else EXIT_FAILED
    status = rec.get("status")
    if status == "succeeded":
        return EXIT_OK
    if status == "cancelled":
        # A graceful stop (SIGTERM, preemption) exits as the signal would (143); a cancel with 130.
        return code if code > 128 else EXIT_CANCELLED
    if code == EXIT_CANCELLED:
        return EXIT_CANCELLED
    return EXIT_FAILED


def _report(console: Console, active: RunHandle) -> None:
    from runner.cli.follow import say_resumable

    rec = active.record
    if rec is None and not active.ended:
        return  # detached: the run goes on
    if rec is None:
        console.print(f"node finished; the record is written by node 0 ({active.run_id})")
        return
    m = rec.get("metrics") or {}
    console.print(f"{rec['status']}: {m.get('steps', 0)} steps, loss {_fmt(m.get('first_loss'))} → "
                  f"{_fmt(m.get('final_loss'))}, {_fmt(m.get('tokens_per_s'), '.0f')} tokens/s", highlight=False)
    if rec.get("failure"):
        f = rec["failure"]
        who = "the run" if f.get("rank") is None else f"rank {f['rank']}"
        console.print(f"[red]{who} failed at step {f['last_step']}: {f['cause']}: {escape(f['message'])}[/red] "
                      f"(log: {f['log']})")
    say_resumable(console, rec)
    export = m.get("export") or {}
    if export.get("dir"):
        # output.save wrote it into the run folder: say where, it is what the user came for.
        console.print(f"export ({export.get('kind')}): {export['dir']}", highlight=False)
    console.print(f"record: {active.record_path}", highlight=False)


def _finish(console: Console, active: RunHandle, code: int, as_json: bool) -> int:
    """Report the run; with --json, the last stdout line is the result object (id, status, record, ...)."""
    _report(console, active)
    rec = active.record
    if as_json:
        result = {"id": active.run_id, "status": (rec or {}).get("status"), "record": str(active.record_path),
                  "final_loss": ((rec or {}).get("metrics") or {}).get("final_loss"), "exit_code": code}
        if code == EXIT_DETACHED:
            _hung_up_json(active.paths, {**result, "status": "running", "detached": True})
        else:
            print(json.dumps(result))
    return _status_exit(rec, code)


def _hung_up_json(paths: RunPaths, result: dict[str, Any]) -> None:
    """The result line of a view that hung up: into the run folder (its terminal is gone), and to stdout only
    where that is a pipe or a file that outlives the terminal."""
    import sys

    records.atomic_write_json(paths.view_result, result)
    try:
        if not sys.stdout.isatty():
            print(json.dumps(result), flush=True)
    except OSError:  # stdout was the terminal after all
        pass


def _fmt(x: Any, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def run_headless(spec: RunSpec, runs_dir: Path, records_dir: Path, as_json: bool = False, plain: bool = False,
                 node_rank: int = 0, run_id: str | None = None, force: bool = False) -> int:
    check_run_target(runs_dir, records_dir, run_id)
    console = Console(stderr=as_json, highlight=False, soft_wrap=True)
    estimate = gate_estimate(spec, force, console, runs_dir)
    if spec.hardware.nodes > 1 and node_rank == 0 and run_id is None:
        _print_node_commands(console, spec)
    active, code = launch_and_watch(spec, runs_dir, records_dir, plain, console, estimate, node_rank=node_rank,
                                    run_id=run_id)
    return _finish(console, active, code, as_json)


def resume_headless(run_dir: Path, overrides: list[str], records_dir: Path, as_json: bool = False,
                    plain: bool = False, node_rank: int = 0, force: bool = False) -> int:
    """Continue a run from its latest complete checkpoint (same ranks and nodes); `--set` may raise max_steps."""
    from runner.spec import apply_override, read_spec_file, validate

    spec_path = RunPaths(run_dir).spec
    if not spec_path.is_file():
        raise UserError(f"--resume {run_dir}: no spec.json there (expected a run folder such as runs/<id>)")
    check_run_target(run_dir.parent, records_dir, run_dir.name)
    _refuse_live(run_dir)
    done = RunPaths(run_dir).complete_checkpoints()
    data = read_spec_file(spec_path)
    for assignment in overrides:
        apply_override(data, assignment)
    spec = resolve(validate(data))
    _refuse_finished(run_dir, records_dir, spec, done[-1][0] if done else None)
    if not done:
        raise UserError(f"--resume {run_dir}: no complete checkpoint under {run_dir / 'checkpoints'} "
                        "(set train.checkpoint_every, or stop a run with SIGTERM, to get one)")
    console = Console(stderr=as_json, highlight=False, soft_wrap=True)
    console.print(f"resuming {run_dir.name} from step {done[-1][0]}")
    estimate = gate_estimate(spec, force, console, run_dir.parent, from_step=done[-1][0])
    active, code = launch_and_watch(spec, run_dir.parent, records_dir, plain, console, estimate, node_rank=node_rank,
                                    run_id=run_dir.name, resume=True)
    return _finish(console, active, code, as_json)


def _refuse_live(run_dir: Path) -> None:
    from runner.launch.supervised import supervisor_alive
    from runner.launch.supervisor import read_state
    from runner.events.paths import RunPaths

    state = read_state(RunPaths(run_dir))
    # Only a supervisor on this host can be seen alive; one elsewhere (a requeued job's last node) is not asked.
    if state and state.get("state") != "finished" and state.get("host") == socket.gethostname() \
            and supervisor_alive(state):
        raise UserError(f"--resume {run_dir}: that run is still running (supervisor pid {state.get('pid')}); "
                        f"follow it with `runner attach {run_dir.name}`")


def _refuse_finished(run_dir: Path, records_dir: Path, spec: RunSpec, checkpoint_step: int | None) -> None:
    """A run that reached its end has nothing to resume unless train.max_steps is raised; its record stays as is."""
    path = records_dir / f"{run_dir.name}.json"
    if not path.is_file():
        return
    rec = records.load(path)
    steps = (rec.get("metrics") or {}).get("steps") or 0
    max_steps = spec.train.max_steps
    if rec.get("status") == "succeeded" and (max_steps is None or max_steps <= max(steps, checkpoint_step or 0)):
        raise UserError(f"--resume {run_dir}: nothing to resume: the run succeeded at step {steps}; to train "
                        f"further, raise train.max_steps (e.g. --set train.max_steps={steps * 2 or 100}) "
                        "or start a new run")


def attach_headless(run_ref: str, runs_dir: Path, records_dir: Path, plain: bool = False, as_json: bool = False,
                    request: str | None = None) -> int:
    """Follow a run started elsewhere; with `request` ("cancel" or "stop"), ask for it first."""
    from runner.cli.follow import follow, say_detached

    run = api.attach(run_ref, runs_dir)
    console = Console(stderr=as_json, highlight=False, soft_wrap=True)
    if run.poll() is None:
        if request is not None:
            run.request(request, None, by="runner attach")
        console.print(f"attached to run {run.run_id} ({run.state.get('host')}, supervisor pid "
                      f"{run.state.get('pid')}); Ctrl+C asks whether to cancel it", highlight=False)
        followed = follow(run, console, plain, ask=True, by="runner attach")
        if followed.detached:
            say_detached(console, run)
            return EXIT_OK if followed.code == 0 else followed.code
        code = followed.code
    else:
        code = run.poll() or 0
    run.finish(code)
    return _finish(console, run, code, as_json)


def _print_node_commands(console: Console, spec: RunSpec) -> None:
    console.print(f"multi-node run over {spec.hardware.nodes} nodes: start the same spec on every other node with "
                  "`runner run SPEC --node-rank K --run-id <id printed below>`", highlight=False)


def replay_headless(ref: str, runs_dir: Path, records_dir: Path, strict: bool = False, as_json: bool = False,
                    plain: bool = False, trust_remote_code: bool = False, here: bool = False) -> int:
    console = Console(stderr=as_json, highlight=False, soft_wrap=True)
    path = records.find_record(ref, records_dir)
    if not here:  # a job's record is rerun where it ran: print how (after checking its lock)
        ok, reason = records.verify(path)
        if not ok:
            raise UserError(f"refusing to replay: {reason}")
        if print_job_rerun(console, records.load(path), path, as_json):
            return EXIT_OK
    prepared = api.prepare_replay(path, trust_remote_code=trust_remote_code)  # its spec pins the recorded decisions
    original, spec, rows = prepared.original, prepared.spec, prepared.drift
    pinned = pinned_decisions(original)
    console.print("engine decisions pinned from the record: " + (
        "all (its decisions file)" if prepared.decisions is not None else
        ", ".join(f"{k}={v}" for k, v in pinned.items()) if pinned else "none (the record holds none: today's rules "
        "decide)"))
    print_drift(console, rows)
    strict_rows = [r for r in rows if r["strict"]]
    if strict and strict_rows:
        raise UserError(f"--strict: {len(strict_rows)} pin(s) differ from the record "
                        f"({', '.join(r['pin'] for r in strict_rows[:5])}{'…' if len(strict_rows) > 5 else ''})")
    active, code = launch_and_watch(spec, runs_dir, records_dir, plain, console, original.get("estimate"),
                                    replay_of=original["id"], decisions=prepared.decisions)
    if code == EXIT_DETACHED:
        return code
    _report(console, active)
    rec = active.record or {}
    result = compare(original, rec, tolerance(spec, rows))
    other_cpu = next((r for r in rows if r["pin"] == CPU_PIN), None)
    if other_cpu and spec.hardware.device == "cpu":
        result["message"] += (f"; recorded on {other_cpu['recorded']}, replayed on {other_cpu['current']}: a CPU run "
                              "replays bit for bit on its own CPU model only")
    if "max_abs_eval_loss_diff" in result:
        steps = "same eval steps" if result["eval_same_steps"] else "[red]different eval steps[/red]"
        console.print(f"eval curve: max |Δeval loss| = {result['max_abs_eval_loss_diff']:g} ({steps})")
    first = result["first_divergence"]
    where = f"; first divergence at rank {first['rank']} step {first['step']}: {first['original']} → " \
            f"{first['replay']}" if first and not result["reproduced"] else ""
    style = "" if result["reproduced"] else "[red]"
    console.print(f"{style}{escape(result['message'] + where)}{'[/red]' if style else ''}")
    if as_json:
        print(json.dumps({"id": active.run_id, "status": rec.get("status"), "record": str(active.record_path),
                          "replay_of": original["id"], "reproduced": result["reproduced"],
                          "message": result["message"],
                          "max_abs_loss_diff": result["max_abs_loss_diff"],
                          "first_divergence": result["first_divergence"],
                          "max_abs_eval_loss_diff": result.get("max_abs_eval_loss_diff"), "drift": rows,
                          "samples_match": result.get("samples_match"),
                          "pinned": pinned}))
    status_code = _status_exit(rec, code)
    if status_code != EXIT_OK:
        return status_code
    return EXIT_OK if result["reproduced"] else EXIT_NOT_REPRODUCED


def print_drift(console: Console, rows: list[dict[str, Any]]) -> None:
    if not rows:
        console.print("pins: identical to the record")
        return
    table = Table(title=f"{len(rows)} pin(s) differ from the record", title_justify="left")
    for col in ("pin", "recorded", "current", "strict"):
        table.add_column(col)
    folded = [r for r in rows if folds(r)]
    for r in rows:
        if not folds(r):
            table.add_row(r["pin"], str(r["recorded"]), str(r["current"]), "yes" if r["strict"] else "")
    if folded:
        # Packages that do not change the numbers: a count, the names in `--json`'s drift rows.
        table.add_row(f"{len(folded)} other package(s)", "", "", "yes")
    console.print(table)


def print_job_rerun(console: Console, rec: dict[str, Any], path: Path, as_json: bool) -> bool:
    """A record a scheduler job wrote is replayed where it ran: print the commands that write and submit the same
    job (the nodes it needs are there, not here). False when the record ran on this kind of machine."""
    from runner.cli.job import rerun_lines

    lines = rerun_lines(rec, path)
    if lines is None:
        return False
    where = (rec.get("launch") or {}).get("scheduler") or {}
    ran = f" (job {where.get('job_id')} on {where.get('node_count') or '?'} node(s): {where.get('nodes')})" \
        if where.get("job_id") else ""
    console.print(f"{rec['id']} ran as a {rec['launch']['job']['target']} job{ran}; rerun it there with:")
    for line in lines:
        console.print(f"  {line}", markup=False)
    console.print(f"then `runner diff {rec['id']} <the new run id>` compares them; `runner replay --here` replays "
                  "it on this machine instead", markup=False)
    if as_json:
        # The keys of a replay's result, empty: nothing ran here.
        print(json.dumps({"id": None, "status": None, "record": None, "replay_of": rec["id"], "reproduced": None,
                          "job": rec["launch"]["job"]["target"], "commands": lines}))
    return True
