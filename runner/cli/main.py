"""The `runner` command: run, estimate, replay, verify, diff, list, fields, recipes, export, generate, chat."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.cli import after
from runner.cli.job import add_job_args, record_spec, write_job
from runner.errors import (EXIT_BAD_INPUT, EXIT_CANCELLED, EXIT_FAILED, EXIT_NOT_VERIFIED,
                           EXIT_OK, UserError)
from runner.engines import ENGINES

if TYPE_CHECKING:
    from runner.spec import RunSpec

# Rich wraps and crops at 80 columns when stdout is not a terminal; piped output is read by scripts and people who
# need every character (a run id, a field name), so it gets a width no line reaches.
PIPE_COLUMNS = "100000"
# Commands that only print (a launching one would hand the width to its ranks' progress bars through the env).
WIDE_WHEN_PIPED = {"estimate", "verify", "diff", "list", "show", "calibrate", "fields", "recipes"}

EPILOG = """\
SPEC is a recipe name (see `runner recipes`) or a path to a YAML/JSON spec; `--set a.b=value` overrides any
field (see `runner fields`). Exit codes: 0 ok, 1 run failed, 2 bad input, 3 replay did not reproduce,
4 record does not verify (its lock does not match its content), 129 the view lost its terminal (SIGHUP) and
detached (the run goes on), 130 cancelled, 143 stopped gracefully by SIGTERM or preempted (a checkpoint was written
once a step was taken: `runner run --resume` continues).

examples:
  runner run tiny-cpu                       # 2 CPU ranks on the embedded model and data
  runner run tiny-cpu --set train.max_steps=20 --json
  runner estimate qwen3.8-27b-full-8xb300 --sweep train.seq_len=8192,32768 --sweep hardware.gpu=H100-80GB,B300
  runner run --resume runs/<id> --set train.max_steps=400   # continue from the latest checkpoint
  runner replay records/<id>.json           # re-run and compare the loss curves (a path or an id)
  runner verify <id>                        # check the record's lock (exit 4 when it does not match)
  runner job my.yaml --to slurm --set hardware.nodes=2 --set hardware.nproc_per_node=8   # an sbatch script
  runner list --json                        # every record as JSON (id, status, model, dataset, steps, loss)
  runner attach <id>                        # follow a running run (started anywhere on this machine)
  runner bench qwen3-1.7b-full-h200 --engines native,trl --sweep train.seq_len=8192,32768
  runner generate <id> --prompt "Hello"     # the tuned model's answer (--base: the base model's)
  runner export <id> --as merged            # LoRA folded into the base: a model that loads without peft
"""


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="recipe name or path to a YAML/JSON spec")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a spec field, e.g. --set train.lr=1e-4 (repeatable)")


RECORDS_DIR_HELP = "the records folder: where records go and ids are looked up (default: records)"


def _add_records_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records-dir", type=Path, default=Path("records"), help=RECORDS_DIR_HELP)


def _add_dirs(p: argparse.ArgumentParser) -> None:
    _add_records_dir(p)
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where run folders go (default: runs)")


def _add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="launch a run headless and write its record")
    p.add_argument("spec", metavar="SPEC", nargs="?", help="recipe name or path to a YAML/JSON spec")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a spec field, e.g. --set train.lr=1e-4 (repeatable)")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR",
                   help="continue runs/<id> from its latest checkpoint (--set may raise train.max_steps)")
    _add_dirs(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (id, status, record) as the last line")
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank in a multi-node run")
    p.add_argument("--run-id", help="join an existing run id (multi-node: the id node 0 printed)")
    p.add_argument("--force", action="store_true",
                   help="launch even when the estimate says it does not fit (GPU memory, or the checkpoints and "
                        "export on disk)")


def _add_attach(sub: Any) -> None:
    p = sub.add_parser("attach", help="follow a running run live (Ctrl+C asks: cancel, detach or keep watching)")
    p.add_argument("run", metavar="RUN", help="run id (see `runner list`) or run folder")
    _add_dirs(p)
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    p.add_argument("--json", action="store_true", help="print one JSON object (id, status, record) as the last line")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--cancel", action="store_true", help="cancel the run (no checkpoint beyond the usual) and wait")
    what.add_argument("--stop", action="store_true",
                      help="stop the run gracefully with a checkpoint (as SIGTERM does) and wait")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runner", description="Plan, launch, record and replay SFT runs.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    _add_run(sub)

    p = sub.add_parser("job", help="write the job file that runs SPEC on a scheduler: slurm, skypilot or kubeflow")
    add_job_args(p, with_target=True)
    p = sub.add_parser("slurm", help="write an sbatch script that runs SPEC (runner job --to slurm)")
    add_job_args(p, with_target=False)

    p = sub.add_parser("estimate", help="predict per-GPU memory and time before launch")
    _add_spec_args(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--sweep", action="append", default=[], metavar="FIELD=V1,V2",
                   help="sweep a field over values, e.g. --sweep train.seq_len=8192,32768 (repeatable)")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"),
                   help="where the run folder would go: its free space is set against the checkpoints' and the "
                        "export's bytes (default: runs)")

    p = sub.add_parser("replay", help="re-run a record and say whether the loss curve was reproduced")
    p.add_argument("record", metavar="RECORD", help="record path or id")
    _add_dirs(p)
    p.add_argument("--strict", action="store_true", help="refuse to run when a package, model or dataset pin differs")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    p.add_argument("--trust-remote-code", action="store_true", help="allow a record that needs trust_remote_code")
    p.add_argument("--here", action="store_true",
                   help="replay on this machine a record that a scheduler job wrote (default: print that job)")

    p = sub.add_parser("verify", help="check that a record's lock matches its content (exit 4 when it does not)")
    p.add_argument("record", metavar="RECORD", help="record path or id")
    _add_records_dir(p)

    p = sub.add_parser("diff", help="show what differs between two records")
    p.add_argument("a", metavar="RECORD_A")
    p.add_argument("b", metavar="RECORD_B")
    _add_records_dir(p)

    _add_attach(sub)

    p = sub.add_parser("list", help="list records (full ids: what replay, verify and diff take); live runs as live")
    _add_records_dir(p)
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per record")

    p = sub.add_parser("bench", help="benchmark engines side by side; results under benchmarks/")
    _add_spec_args(p)
    _add_dirs(p)
    p.add_argument("--engines", default="native,trl", help="comma-separated engines (default: native,trl)")
    p.add_argument("--sweep", action="append", default=[], metavar="FIELD=V1,V2",
                   help="sweep a field, e.g. --sweep train.seq_len=8192,32768 (repeatable)")
    p.add_argument("--steps", type=int, default=10, help="measured steps per row (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps not measured (default 3)")
    p.add_argument("--out", type=Path, default=Path("benchmarks"), help="folder for the JSON and Markdown results")
    p.add_argument("--name", help="file stem of the results (default: bench-<time>)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run every configuration N times, interleaved, and report the spread of tokens/s (default 1)")
    p.add_argument("--max-seq-len", metavar="LO:HI[:STEP]",
                   help="instead of timing, find each engine's largest train.seq_len that fits by bisection over "
                        "2-step runs, beside the estimator's prediction (e.g. 32768:262144:4096)")
    _add_tune(sub)  # runner tune shares bench's probe runs
    p = sub.add_parser("calibrate", help="estimate vs measured peak memory over a records folder")
    _add_records_dir(p)
    p.add_argument("--json", action="store_true", help="print a JSON list, one row per record")

    p = sub.add_parser("show", help="print a spec after overrides and defaults, its `auto` values filled as a "
                                    "launch would fill them (what would run)")
    _add_spec_args(p)
    p.add_argument("--as-written", action="store_true",
                   help="print the spec with its `auto` values left as they are")

    p = sub.add_parser("fields", help="every spec field with its default and meaning")
    p.add_argument("prefix", nargs="?", default="", metavar="PREFIX",
                   help="only the fields whose name starts with it, e.g. `runner fields train.`")
    sub.add_parser("recipes", help="the recipes shipped with the package")
    after.add_parsers(sub, _add_records_dir)
    return parser


def _add_tune(sub: Any) -> None:
    p = sub.add_parser("tune", help="the fastest speed levers that fit, optionally measured; write them as a recipe")
    _add_spec_args(p)
    _add_dirs(p)
    p.add_argument("--probe", type=int, default=0, metavar="K",
                   help="run 3 steps of each of the K best candidates here and keep the measured fastest")
    p.add_argument("-o", "--out", type=Path, help="write the spec with the chosen levers as a recipe YAML")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    if args.command is None:
        parser.print_help()
        return EXIT_OK
    columns = os.environ.get("COLUMNS")
    if not sys.stdout.isatty() and args.command in WIDE_WHEN_PIPED:
        os.environ["COLUMNS"] = PIPE_COLUMNS
    try:
        return COMMANDS[args.command](args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("cancelled", file=sys.stderr)
        return EXIT_CANCELLED
    except BrokenPipeError:
        # `runner list | head`: the reader has all it wanted; no traceback, and none again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    finally:
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns


# ---------------------------------------------------------------------------------------------


def load_spec_noting(spec: Any, overrides: list[str]) -> Any:
    """The spec loaded (runner.api.load), with a `note:` line on stderr for each id renamed after its new path."""
    from runner import api

    notes: list[str] = []
    loaded = api.load(spec, overrides, notes=notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return loaded


def cmd_run(args: argparse.Namespace) -> int:
    from runner.launch.command import check_run_target

    if args.resume is None:
        # Bad folders and ids are refused before the spec, the estimate and preflight are paid for.
        check_run_target(args.runs_dir, args.records_dir, args.run_id)
    from runner.cli.session import resume_headless, run_headless
    from runner.spec import resolve, spec_warnings

    if args.resume is not None:
        if args.spec:
            raise UserError("give either SPEC or --resume RUN_DIR, not both (a resumed run keeps its own spec)")
        return resume_headless(args.resume, args.overrides, args.records_dir, as_json=args.json, plain=args.plain,
                               node_rank=args.node_rank, force=args.force)
    if not args.spec:
        raise UserError("runner run needs a SPEC (a recipe name such as tiny-cpu, or a YAML/JSON path)")
    spec = resolve(load_spec_noting(args.spec, args.overrides))
    for warning in spec_warnings(spec):
        print(f"warning: {warning}", file=sys.stderr)
    return run_headless(spec, args.runs_dir, args.records_dir, as_json=args.json, plain=args.plain,
                        node_rank=args.node_rank, run_id=args.run_id, force=args.force)


def cmd_job(args: argparse.Namespace) -> int:
    spec = record_spec(args.spec, args.overrides, args.records_dir)
    return write_job(args, spec or load_spec_noting(args.spec, args.overrides))


def cmd_estimate(args: argparse.Namespace) -> int:
    from runner import api
    from runner.plan import parse_sweep

    parsed = [parse_sweep(s) for s in args.sweep]
    spec = load_spec_noting(args.spec, args.overrides)
    if parsed:
        rows = api.sweep(spec, parsed)
        if args.json:
            print(json.dumps(rows))
        else:
            _print_sweep(spec, rows, [k for k, _ in parsed])
        return EXIT_OK
    est = api.estimate(spec)
    disk = api.disk_plan(spec, args.runs_dir, est.steps)
    if args.json:
        print(json.dumps({**est.to_dict(), "disk": disk and disk.to_dict()}))
    else:
        _print_estimate(spec, est)
        if disk is not None:
            from rich.console import Console
            from rich.text import Text

            line = disk.describe() + ("" if disk.fits else ": does not fit (runner run refuses it without --force)")
            Console(highlight=False).print(Text(line, style="" if disk.fits else "red"))
    return EXIT_OK


# How `runner estimate` prints an estimate and a sweep

VERDICT_STYLE = {"fits": "green", "tight": "yellow", "does not fit": "red"}


def _hours(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _print_estimate(spec: Any, est: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    a = est.arch
    active = f", {_count(a['params_active'])} active" if a["params_active"] != a["params_total"] else ""
    console.print(f"[bold]{spec.name}[/bold]: {spec.model.id} ({a['model_type']}, {_count(a['params_total'])} params"
                  f"{active}), {est.engine} {est.method}, {est.world_size} × {est.gpu}, "
                  f"{est.seq_len:,} tokens per block, "
                  f"{est.attn_implementation}, loss {est.loss_impl}, checkpointing "
                  f"{'on' if est.activation_checkpointing else 'off'}")
    table = Table(title=f"per-{'GPU' if est.device == 'cuda' else 'rank'} memory at the peak ({est.peak_phase})",
                  show_header=True)
    table.add_column("part")
    table.add_column("GiB", justify="right")
    for k, v in est.breakdown.items():
        table.add_row(k, f"{v:.2f}")
    # One wording for the figure the verdict is about, as the wizard and the summary say it: GiB needed per unit.
    unit = "GPU" if est.device == "cuda" else "rank"
    table.add_row(f"[bold]needed per {unit}[/bold]", f"[bold]{est.per_gpu_gib:.2f}[/bold]")
    if est.device == "cuda":
        table.add_row("allocated peak", f"{est.per_gpu_allocated_gib:.2f}")
    if est.per_gpu_reserved_gib > est.per_gpu_gib:
        table.add_row("reserved, as nvidia-smi shows it", f"{est.per_gpu_reserved_gib:.2f}")
    console.print(table)
    style = VERDICT_STYLE[est.verdict]
    host = "; host memory is the limit (see notes)" if "host memory is the limit" in est.approximate_reason else ""
    console.print(f"[{style}]{est.verdict}[/{style}]: {est.per_gpu_gib:.2f} GiB needed per {unit} of "
                  f"{est.gpu_memory_gib:.1f} GiB (headroom {est.headroom_gib:.1f} GiB){host}")
    console.print(f"time: {est.step_s:.2f} s/step × {est.steps if est.steps is not None else '?'} steps = "
                  f"{_hours(est.total_s)} with setup ({est.tokens_per_step:,} tokens/step, "
                  f"{est.flops_per_step:.3g} FLOP/step, "
                  + (f"HFU {est.hfu_assumed:.2f} assumed)" if est.device == "cuda" else f"{est.hfu_source})"))
    if est.dataset_format:
        from rich.markup import escape

        console.print(f"data: {escape(est.dataset_format['summary'])}")
    if est.packing:
        p = est.packing
        console.print(f"packing ({p['strategy']}, {p['sampled_rows']:,} sampled rows): "
                      f"{p['packing_efficiency']:.1%} of each block is real tokens, {p['split_documents']:,} of "
                      f"{p['documents']:,} conversations split across blocks")
    if est.levers:
        from runner.cli.tune import print_plan

        print_plan(console, est)
    if est.suggestion:
        console.print(f"suggestion: {est.suggestion}")
    if est.approximate_reason:
        console.print(f"[dim]{'approximate: ' if est.approximate else 'notes: '}{est.approximate_reason}[/dim]")


def _print_sweep(spec: Any, rows: list[dict[str, Any]], keys: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{spec.name}: {spec.model.id}")
    short = [k.split(".")[-1] for k in keys]
    for k, name in zip(keys, short):
        table.add_column(name if short.count(name) == 1 else k, no_wrap=True)
    for col in ("GiB/GPU", "of GiB", "verdict", "s/step", "total h"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        style = VERDICT_STYLE[r["verdict"]]
        total = "-" if r["total_s"] is None else f"{r['total_s'] / 3600:.2f}"
        table.add_row(*[str(r["swept"][k]) for k in keys], f"{r['per_gpu_gib']:.1f}", f"{r['gpu_memory_gib']:.1f}",
                      f"[{style}]{r['verdict']}[/{style}]", f"{r['step_s']:.2f}", total)
    Console(highlight=False).print(table)


def cmd_replay(args: argparse.Namespace) -> int:
    from runner.cli.session import replay_headless
    from runner.spec import recipe_names

    ref = args.record
    if Path(ref).suffix in (".yaml", ".yml") or (ref in recipe_names() and not Path(ref).exists()):
        raise UserError(f"{ref} is a recipe (a spec), not a record: train it with `runner run {ref}`; "
                        "replay takes a record that a run wrote (`runner list` shows their ids)")
    return replay_headless(args.record, args.runs_dir, args.records_dir, strict=args.strict, as_json=args.json,
                           plain=args.plain, trust_remote_code=args.trust_remote_code, here=args.here)


def cmd_verify(args: argparse.Namespace) -> int:
    from runner import api

    path = api.find_record(args.record, args.records_dir)  # no such id or file: bad input (exit 2)
    if not path.is_file():
        raise UserError(f"{path}: no such record file")
    try:
        ok, reason = api.verify(path)
    except api.RecordError as e:  # the file is there but is not an intact record: it does not verify
        ok, reason = False, str(e)
    print(reason, file=sys.stdout if ok else sys.stderr)
    return EXIT_OK if ok else EXIT_NOT_VERIFIED


def cmd_diff(args: argparse.Namespace) -> int:
    from runner import api
    from runner.record.compare import print_diff

    a = api.load_record(api.find_record(args.a, args.records_dir))
    b = api.load_record(api.find_record(args.b, args.records_dir))
    print_diff(a, b, api.diff_records(a, b))
    return EXIT_OK


def cmd_attach(args: argparse.Namespace) -> int:
    from runner.cli.session import attach_headless

    return attach_headless(args.run, args.runs_dir, args.records_dir, plain=args.plain, as_json=args.json,
                           request="cancel" if args.cancel else "stop" if args.stop else None)


def cmd_list(args: argparse.Namespace) -> int:
    from runner import api
    from runner.record.compare import print_list

    # A run whose supervisor died (SIGKILL, the OOM killer) is finished here as failed: nothing stays `running`.
    for run_id in api.reap_lost(args.records_dir):
        print(f"note: {run_id}: its supervisor is gone; record finished as failed (supervisor lost)", file=sys.stderr)
    recs = api.list_records(args.records_dir)
    if args.json:
        print(json.dumps([api.summary_row(r) for r in recs]))
    else:
        print_list(recs)
    return EXIT_OK


def cmd_tune(args: argparse.Namespace) -> int:
    from rich.console import Console

    from runner.cli.tune import tune

    return tune(args.spec, args.overrides, args.probe, args.out, args.runs_dir, args.records_dir,
                Console(highlight=False, soft_wrap=True))


def cmd_bench(args: argparse.Namespace) -> int:
    from runner.cli.bench import bench

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        raise UserError(f"--engines: unknown engine(s) {', '.join(bad)}; use {' and/or '.join(ENGINES)}")
    if args.repeat < 1:
        raise UserError(f"--repeat expects 1 or more runs per configuration, got {args.repeat}")
    result = bench(args.spec, args.overrides, engines, args.sweep, args.steps, args.warmup, args.out, args.runs_dir,
                   args.records_dir, args.name, command=shlex.join(["runner", *args.argv]),
                   max_seq_len=args.max_seq_len, repeat=args.repeat)
    if "limits" in result:
        return EXIT_OK if all(r["search_complete"] for r in result["limits"]["engines"].values()) else EXIT_FAILED
    return EXIT_OK if all(r.get("status") == "succeeded" for r in result["rows"]) else EXIT_FAILED


def cmd_calibrate(args: argparse.Namespace) -> int:
    from runner.cli.calibrate import calibration_rows, print_calibration

    rows = calibration_rows(args.records_dir)
    if args.json:
        print(json.dumps(rows))
    else:
        print_calibration(rows)
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    import yaml

    spec = load_spec_noting(args.spec, args.overrides)
    if not args.as_written:
        spec, note = _filled(spec)
        print(f"# {note}; `runner show --as-written` prints it before", file=sys.stderr)
    print(yaml.safe_dump(spec.to_dict(), sort_keys=False), end="")
    return EXIT_OK


def _filled(spec: RunSpec) -> tuple[RunSpec, str]:
    """The spec with its `auto` values filled as a launch fills them: ranks, device, dtype and precision for the
    machine the run will see (this one, or the GPUs the spec names), then the planner's levers. When the levers
    cannot be chosen here (the data unreadable from this machine), they stay `auto` and the note says why."""
    from runner.machine import Machine, target_machine
    from runner.plan.autotune import resolve_levers
    from runner.spec import resolve

    machine = target_machine(spec, Machine.here())
    spec = resolve(spec, machine=machine)
    where = "the GPUs it names" if machine.declared else "this machine"
    try:
        return resolve_levers(spec), f"auto values filled for {where}, levers by the planner"
    except (UserError, OSError, ValueError) as e:
        return spec, f"auto values filled for {where}; levers left auto ({str(e).splitlines()[0]})"


def cmd_fields(args: argparse.Namespace) -> int:
    from runner.spec import field_choices, field_docs

    rows = [r for r in field_docs() if r[0].startswith(args.prefix)]
    if not rows:
        sections = sorted({p.split(".")[0] + "." for p, _, _ in field_docs() if "." in p})
        raise UserError(f"no spec field starts with '{args.prefix}'; sections: {', '.join(sections)}")
    width = max(len(p) for p, _, _ in rows)
    text_width = max(40, min(shutil_columns(), 120) - 6)
    for path, doc, default in rows:
        print(f"{path:<{width}}  default {json.dumps(_plain(default))}")
        choices = field_choices(path)
        if choices:
            doc = f"{doc} One of: {', '.join(json.dumps(c) for c in choices)}."
        # Descriptions wrap under themselves, indented, never back to column 0.
        print(textwrap.fill(doc, text_width, initial_indent="    ", subsequent_indent="    ") if doc else "")
    return EXIT_OK


def shutil_columns() -> int:
    import shutil

    return shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else 100


def _plain(x: Any) -> Any:
    try:
        json.dumps(x)
        return x
    except TypeError:
        return str(x)


def cmd_recipes(_: argparse.Namespace) -> int:
    from runner.spec import RECIPES_DIR, read_spec_file, recipe_names

    for name in recipe_names():
        data = read_spec_file(RECIPES_DIR / f"{name}.yaml")
        note = (data.get("description") or "") if isinstance(data, dict) else ""
        print(f"{name:<36} {note}")
    return EXIT_OK


COMMANDS = {
    "run": cmd_run,
    "estimate": cmd_estimate,
    "job": cmd_job,
    "slurm": cmd_job,
    "replay": cmd_replay,
    "verify": cmd_verify,
    "diff": cmd_diff,
    "attach": cmd_attach,
    "list": cmd_list,
    "show": cmd_show,
    "bench": cmd_bench,
    "tune": cmd_tune,
    "calibrate": cmd_calibrate,
    "fields": cmd_fields,
    "recipes": cmd_recipes,
    **after.COMMANDS,
}

if __name__ == "__main__":
    sys.exit(main())
