"""Headless sessions: `runner run` and `runner replay` with a live display, shared by `sft-tui --headless`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from runner.events.paths import RunPaths
from runner.record import records
from runner.launch import run as run_mod
from runner.errors import EXIT_CANCELLED, EXIT_FAILED, EXIT_NOT_REPRODUCED, EXIT_OK, PredictedNotToFit, UserError
from runner.launch.replay import prepare_replay
from runner.record.replay import compare, pinned_decisions, tolerance
from runner.spec import RunSpec, resolve


def preflight_estimate(spec: RunSpec, force: bool, console: Console | None = None) -> dict[str, Any] | None:
    """Everything checked before a run starts: preflight (data, template, packing, LoRA targets, kernels; raises
    SpecError listing every problem) and the estimate kept in the record, which refuses a run predicted not to
    fit unless forced and warns when it is tight."""
    from runner.plan import estimate
    from runner.errors import SpecError
    from runner.plan.hub import hub_problems
    from runner.plan.preflight import packing_check, precision_advice, preflight

    unreachable = hub_problems(spec)
    if unreachable:
        raise SpecError("preflight found problems", unreachable)
    preflight(spec)
    check = packing_check(spec)
    if check is not None and console is not None:
        console.print(escape(check.describe()), highlight=False)
    advice = precision_advice(spec)
    if advice and console is not None:
        console.print(f"[yellow]note: {advice}[/yellow]")
    try:
        result = estimate(spec).to_dict()
        if check is not None:
            result["packing_check"] = check.to_dict()  # kept in the record with what was predicted
    except UserError as e:
        # No estimate (e.g. a GPU NVML cannot name) must not stop a run: it only loses the prediction.
        if console is not None:
            console.print(f"[yellow]no estimate: {e}[/yellow]")
        return None
    if spec.hardware.device == "cuda" and result.get("fits") is False and not force:
        raise PredictedNotToFit(f"predicted not to fit: {result.get('per_gpu_gib')} GiB per GPU of "
                        f"{result.get('gpu_memory_gib')} GiB; {result.get('suggestion') or 'see runner estimate'}; "
                        "pass --force to launch anyway")
    if console is not None and result.get("verdict") == "tight":
        unit = "GPU" if spec.hardware.device == "cuda" else "rank"
        console.print(f"[yellow]tight: {result.get('per_gpu_gib')} GiB needed per {unit} of "
                      f"{result.get('gpu_memory_gib')} GiB predicted ({result.get('headroom_gib')} GiB headroom)"
                      "[/yellow]")
    return result


def launch_and_watch(spec: RunSpec, runs_dir: Path, records_dir: Path, plain: bool, console: Console,
                     estimate: dict[str, Any] | None = None, replay_of: str | None = None, node_rank: int = 0,
                     run_id: str | None = None, resume: bool = False) -> tuple[run_mod.ActiveRun, int]:
    from runner.cli.headless import HeadlessDisplay
    from runner.events.monitor import RunView

    active = run_mod.start(spec, runs_dir, records_dir, estimate=estimate, replay_of=replay_of, node_rank=node_rank,
                           run_id=run_id, resume=resume)
    console.print(f"run {active.run_id}: {spec.world_size} rank(s) on {spec.hardware.device}; "
                  f"logs in {active.paths.logs}", highlight=False)
    view = RunView(active.paths.run_dir)
    display = HeadlessDisplay(view, console=console, plain=plain or None)

    def tick() -> None:
        if view.poll():
            display.update()

    try:
        code = run_mod.watch(active, tick)
    finally:
        display.close()
    active.finish(code)
    return active, code


def _status_exit(rec: dict[str, Any] | None, code: int) -> int:
    if rec is None:  # a node other than 0: no record here, the launcher's exit code says it all
        return EXIT_OK if code == 0 else EXIT_CANCELLED if code == EXIT_CANCELLED else EXIT_FAILED
    status = rec.get("status")
    if status == "succeeded":
        return EXIT_OK
    if status == "cancelled" or code == EXIT_CANCELLED:
        return EXIT_CANCELLED
    return EXIT_FAILED


def _report(console: Console, active: run_mod.ActiveRun) -> None:
    rec = active.record
    if rec is None:
        console.print(f"node finished; the record is written by node 0 ({active.run_id})")
        return
    m = rec.get("metrics") or {}
    console.print(f"{rec['status']}: {m.get('steps', 0)} steps, loss {_fmt(m.get('first_loss'))} → "
                  f"{_fmt(m.get('final_loss'))}, {_fmt(m.get('tokens_per_s'), '.0f')} tokens/s", highlight=False)
    if rec.get("failure"):
        f = rec["failure"]
        console.print(f"[red]rank {f['rank']} failed at step {f['last_step']}: {f['cause']}: {f['message']}[/red] "
                      f"(log: {f['log']})")
    export = m.get("export") or {}
    if export.get("dir"):
        # output.save wrote it into the run folder: say where, it is what the user came for.
        console.print(f"export ({export.get('kind')}): {export['dir']}", highlight=False)
    console.print(f"record: {active.record_path}", highlight=False)


def _finish(console: Console, active: run_mod.ActiveRun, code: int, as_json: bool) -> int:
    """Report the run; with --json, the last stdout line is the result object (id, status, record, ...)."""
    _report(console, active)
    rec = active.record
    if as_json:
        print(json.dumps({"id": active.run_id, "status": (rec or {}).get("status"), "record": str(active.record_path),
                          "final_loss": ((rec or {}).get("metrics") or {}).get("final_loss"), "exit_code": code}))
    return _status_exit(rec, code)


def _fmt(x: Any, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def run_headless(spec: RunSpec, runs_dir: Path, records_dir: Path, as_json: bool = False, plain: bool = False,
                 node_rank: int = 0, run_id: str | None = None, force: bool = False) -> int:
    console = Console(stderr=as_json, highlight=False, soft_wrap=True)
    estimate = preflight_estimate(spec, force, console)
    if spec.hardware.nodes > 1 and node_rank == 0 and run_id is None:
        _print_node_commands(console, spec)
    active, code = launch_and_watch(spec, runs_dir, records_dir, plain, console, estimate, node_rank=node_rank,
                                    run_id=run_id)
    return _finish(console, active, code, as_json)


def resume_headless(run_dir: Path, overrides: list[str], records_dir: Path, as_json: bool = False,
                    plain: bool = False, node_rank: int = 0, force: bool = False) -> int:
    """Continue a run from its latest complete checkpoint (same ranks and nodes); `--set` may raise max_steps."""
    from runner.spec import apply_override, read_spec_file, validate
    from runner.train.checkpoint import complete_checkpoints

    spec_path = RunPaths(run_dir).spec
    if not spec_path.is_file():
        raise UserError(f"--resume {run_dir}: no spec.json there (expected a run folder such as runs/<id>)")
    done = complete_checkpoints(run_dir)
    if not done:
        raise UserError(f"--resume {run_dir}: no complete checkpoint under {run_dir / 'checkpoints'} "
                        "(set train.checkpoint_every, or cancel a run with checkpointing on, to get one)")
    data = read_spec_file(spec_path)
    for assignment in overrides:
        apply_override(data, assignment)
    spec = resolve(validate(data))
    console = Console(stderr=as_json, highlight=False, soft_wrap=True)
    console.print(f"resuming {run_dir.name} from step {done[-1][0]}")
    estimate = preflight_estimate(spec, force, console)
    active, code = launch_and_watch(spec, run_dir.parent, records_dir, plain, console, estimate, node_rank=node_rank,
                                    run_id=run_dir.name, resume=True)
    return _finish(console, active, code, as_json)


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
    prepared = prepare_replay(path, trust_remote_code=trust_remote_code)  # its spec pins the recorded decisions
    original, spec, rows = prepared.original, prepared.spec, prepared.drift
    pinned = pinned_decisions(original)
    console.print("engine decisions pinned from the record: " + (
        ", ".join(f"{k}={v}" for k, v in pinned.items()) if pinned else "none (the record holds none: today's rules "
        "decide)"))
    print_drift(console, rows)
    strict_rows = [r for r in rows if r["strict"]]
    if strict and strict_rows:
        raise UserError(f"--strict: {len(strict_rows)} pin(s) differ from the record "
                        f"({', '.join(r['pin'] for r in strict_rows[:5])}{'…' if len(strict_rows) > 5 else ''})")
    active, code = launch_and_watch(spec, runs_dir, records_dir, plain, console, original.get("estimate"),
                                    replay_of=original["id"])
    _report(console, active)
    rec = active.record or {}
    result = compare(original, rec, tolerance(spec))
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
    for r in rows:
        table.add_row(r["pin"], str(r["recorded"]), str(r["current"]), "yes" if r["strict"] else "")
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
