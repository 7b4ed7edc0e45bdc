"""`runner bench`: engines side by side on the same model, data, block size and seed; results under benchmarks/."""

from __future__ import annotations

import itertools
import json
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from runner.events.paths import RunPaths
from runner.launch import run as run_mod
from runner.engines import LEVERS, engine_for
from runner.errors import UserError
from runner.events.lines import EndEvent, TrainBeginEvent, first_event, latest_steps, read_events
from runner.facts.flops import attention_flops_per_doc_len_sq, model_flops_per_token, utilisation
from runner.facts.gpus import ceiling_tflops_here
from runner.spec import RunSpec, load_spec, resolve
from runner.versions import package_versions

VERSIONS = ("torch", "transformers", "trl", "peft", "accelerate", "liger-kernel", "flash-attn", "flash-attn-4",
            "nvidia-cutlass-dsl", "datasets")


def parse_sweeps(sweeps: list[str]) -> list[tuple[str, list[str]]]:
    """Each `--sweep field=v1,v2` as (field, values), checked as `runner estimate --sweep` checks it."""
    from runner.plan.sweep import parse_sweep

    return [parse_sweep(s) for s in sweeps]


# A row's engine runs without the levers it lacks (runner.engines: Engine.lacks, each set to its LEVERS `off`
# value, and the row says so), so one spec can hold the native engine's best settings and still be compared with
# TRL. TRL keeps fp32 master weights whatever the precision asked (its `auto`), so
# `--sweep train.optimizer_precision=auto,bf16` gives one trl row beside both native ones, in one table whose losses
# are compared.


def _lacked_off(engine: str, override: str) -> str:
    key = override.split("=", 1)[0]
    return f"{key}={LEVERS[key].off}" if key in engine_for(engine).lacks else override


def _row_engine(combo: list[str]) -> str:
    return combo[0].split("=", 1)[1]


def combos(engines: list[str], sweeps: list[tuple[str, list[str]]]) -> list[list[str]]:
    """Override lists, one per benchmark row: engine × the cartesian product of the sweeps. A row skips sweeps
    over the levers its engine lacks (it would repeat the same run)."""
    axes = [[f"engine={e}" for e in engines]] + [[f"{k}={v}" for v in vals] for k, vals in sweeps]
    out, seen = [], set()
    for c in itertools.product(*axes):
        combo = [_lacked_off(_row_engine(list(c)), o) for o in c]
        if tuple(combo) not in seen:
            seen.add(tuple(combo))
            out.append(combo)
    return out


def row_spec(spec_ref: str, overrides: list[str], combo: list[str], steps: int) -> tuple[RunSpec, list[str]]:
    """The row's spec and the settings its engine lacks that the row leaves out."""
    dropped: list[str] = []
    lacks = engine_for(_row_engine(combo)).lacks
    if lacks:
        base = load_spec(spec_ref, overrides).to_dict()
        dropped = [f for f in lacks if f.split(".")[1] in base[f.split(".")[0]]  # a field this version has
                   and str(base[f.split(".")[0]][f.split(".")[1]]).lower() not in
                   (LEVERS[f].off.replace("null", "none"), "auto")]
    spec = load_spec(spec_ref, [*overrides, *combo, *(f"{f}={LEVERS[f].off}" for f in dropped),
                                f"train.max_steps={steps}",
                                "train.log_every=1", "output.save=none"])
    return resolve(spec), dropped


def model_arch(spec: RunSpec) -> Any | None:
    """The spec's architecture for the FLOPs counts; None for one the catalog cannot read (no MFU then)."""
    try:
        from runner.facts.catalog import load_arch

        return load_arch(spec).arch
    except Exception:  # noqa: BLE001 - an unknown architecture only loses the MFU column
        return None


def summarize(spec: RunSpec, events_dir: Path, warmup: int, ceiling_tflops: float | None) -> dict[str, Any]:
    """Per-step timings after warm-up, tokens/s per GPU, MFU, peak memory and the share of time spent on data."""
    per_rank = []
    peaks_alloc, peaks_res = [], []
    begin: dict[str, Any] = {}
    final_loss = None
    for r in range(spec.world_size):
        evs = read_events(RunPaths.of_events(events_dir).rank_events(r))
        steps = [e for e in latest_steps(evs) if e.step > warmup]
        end: EndEvent | None = first_event(evs, EndEvent)
        if r == 0:
            first: TrainBeginEvent | None = first_event(evs, TrainBeginEvent)
            begin = first.line if first else {}
            final_loss = end.final_loss if end else None
        peak = (end.peak_mem_gib if end else None) or {}
        if "allocated" in peak:
            peaks_alloc.append(peak["allocated"])
            peaks_res.append(peak["reserved"])
        if steps:
            per_rank.append(steps)
    if not per_rank:
        return {"error": "no steps after warm-up"}
    step_s = [statistics.median(e.step_s for e in s) for s in per_rank]
    rank0 = per_rank[0]
    times = [e.step_s for e in rank0]
    tokens = [e.tokens for e in rank0]
    tokens_per_s_gpu = statistics.mean(sum(e.tokens for e in s) / sum(e.step_s for e in s) for s in per_rank)
    data_s = [e.get("data_s") for e in rank0 if e.get("data_s") is not None]
    row: dict[str, Any] = {
        "steps_measured": len(rank0),
        "step_s_median": round(max(step_s), 4),
        "step_s_spread": round((max(times) - min(times)) / statistics.median(times), 4) if len(times) > 1 else 0.0,
        "tokens_per_step": int(statistics.mean(tokens)),
        "tokens_per_s": round(tokens_per_s_gpu, 1),
        "data_wait_share": round(sum(data_s) / sum(times), 4) if data_s else None,
        "peak_alloc_gib": max(peaks_alloc) if peaks_alloc else None,
        "peak_reserved_gib": max(peaks_res) if peaks_res else None,
        "mfu": None,
        "final_loss": final_loss,
        # Speed means little without learning: the loss at the last measured step, to compare rows at equal steps.
        "last_step": rank0[-1].step,
        "last_loss": _loss(rank0[-1].get("loss")),
        # What the engine chose, as its train_begin event says.
        "choices": {k: begin[k] for k in ("attn", "attn_kernel", "loss_impl", "liger_kernels", "fsdp",
                                          "optimizer_precision", "tiled_mlp") if k in begin},
    }
    arch = model_arch(spec)
    if arch is not None and ceiling_tflops:
        # MFU (runner/facts/flops.py): model FLOPs + attention FLOPs over the step time and the ceiling. Recompute for
        # activation checkpointing is not useful work and is not counted.
        attn = [e.get("doc_len_sq") for e in rank0]
        counted = all(attn)
        attn_flops = attention_flops_per_doc_len_sq(arch) * statistics.mean(attn) if counted else 0.0
        if counted:  # the measured blocks' attention work: Σ doc_len² per step (the estimator's input too)
            row["doc_len_sq_per_step"] = round(statistics.mean(attn))
        flops = model_flops_per_token(arch) * row["tokens_per_step"] + attn_flops
        row["mfu"] = round(utilisation(flops, row["step_s_median"], ceiling_tflops), 4)
        # An engine that does not report its documents' lengths gets the model FLOPs only: say so beside the figure.
        row["flops_formula"] = "6*N_active_nonembed*tokens" + (" + 6*L_full_attn*q_width*sum(doc_len^2)"
                                                                if counted else " (attention not counted)")
    return row


def _loss(v: Any) -> float | None:
    """A step line's loss as a float; a diverged one ("nan", "inf") stays a float so that it is flagged."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


LOSS_GAP = 0.05
"""Two rows whose losses after the same steps differ by more than this share did not learn equally: their
tokens/s are not a fair comparison."""


def loss_gaps(rows: list[dict[str, Any]], gap: float = LOSS_GAP) -> list[dict[str, Any]]:
    """Pairs of succeeded rows on the same model and block length, measured to the same step, whose losses at that
    step differ by more than `gap` of the lower one (a NaN loss always differs)."""
    done = [(i, r) for i, r in enumerate(rows) if r.get("status") == "succeeded" and r.get("last_loss") is not None]
    out = []
    for (i, a), (j, b) in itertools.combinations(done, 2):
        if (a["model"], a["seq_len"], a.get("last_step")) != (b["model"], b["seq_len"], b.get("last_step")):
            continue
        lo, hi = sorted((a["last_loss"], b["last_loss"]))
        differs = not (lo == lo and hi == hi) or hi - lo > gap * abs(lo)  # x != x only for NaN
        if differs:
            out.append({"rows": [i + 1, j + 1], "overrides": [a["overrides"], b["overrides"]],
                        "step": a["last_step"], "losses": [a["last_loss"], b["last_loss"]],
                        "gap": round((hi - lo) / abs(lo), 4) if lo == lo and hi == hi and lo else None})
    return out


def doc_tokens(record: dict[str, Any]) -> dict[str, Any] | None:
    """The lengths of the documents the run trained on (every rank, warm-up steps included), from its record:
    count, mean, p50, p90, max tokens, and `split`, how many of them were split across blocks."""
    packing = (record.get("metrics") or {}).get("packing") or {}
    docs = packing.get("doc_tokens")
    if not docs:
        return None
    return {k: docs.get(k) for k in ("count", "mean", "p50", "p90", "max", "split")}


def versions() -> dict[str, str | None]:
    out = package_versions(VERSIONS)
    try:
        import torch

        out["cuda"] = torch.version.cuda
    except ImportError:
        pass
    return out


def gpu_info() -> dict[str, Any]:
    from runner.record.pins import gpu_pins

    g = gpu_pins()
    return {"name": g["names"][0] if g["names"] else None, "count": g["count"], "driver": g["driver"]}


def bench(spec_ref: str, overrides: list[str], engines: list[str], sweeps: list[str], steps: int, warmup: int,
          out_dir: Path, runs_dir: Path, records_dir: Path, name: str | None = None,
          console: Console | None = None, command: str | None = None, max_seq_len: str | None = None,
          repeat: int = 1) -> dict[str, Any]:
    """Throughput rows (engines × sweeps, each `repeat` times, interleaved so that drift spreads over every
    configuration), or with `max_seq_len` ('LO:HI[:STEP]') the largest block length that fits per engine
    (runner/cli/bench_limit.py)."""
    console = console or Console(stderr=True, highlight=False, soft_wrap=True)
    parsed = parse_sweeps(sweeps)
    if max_seq_len is not None and any(k == "train.seq_len" for k, _ in parsed):
        raise UserError("--max-seq-len searches train.seq_len itself: leave it out of --sweep")
    rows: list[dict[str, Any]] = []
    peak = None
    plan = [combo for _ in range(repeat) for combo in combos(engines, parsed)]
    per_round = len(plan) // repeat
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = name or f"bench-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"
    result = {
        "command": command,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gpu": gpu_info(), "peak_tflops": peak, "versions": versions(), "warmup_steps": warmup, "steps": steps,
        "rows": rows,
    }
    if max_seq_len is not None:
        from runner.cli import bench_limit

        lengths = bench_limit.grid(*bench_limit.parse_range(max_seq_len))
        specs = {e: row_spec(spec_ref, overrides, [f"engine={e}"], bench_limit.PROBE_STEPS)[0] for e in engines}
        result["limits"] = bench_limit.find_limits(specs, lengths, runs_dir, records_dir, console)
        write_results(result, out_dir, stem)
        console.print("\n".join(bench_limit.markdown(result["limits"])))
        console.print(f"wrote {out_dir / stem}.json and .md")
        return result
    for i, combo in enumerate(plan, 1):
        spec, dropped = row_spec(spec_ref, overrides, combo, warmup + steps)
        if peak is None:
            peak = result["peak_tflops"] = ceiling_tflops_here(spec.hardware.device)
        note = f" (without native-only {', '.join(dropped)})" if dropped else ""
        console.print(f"bench {i}/{len(plan)}: {' '.join(combo)}{note}")
        active = run_mod.start(spec, runs_dir, records_dir)
        code = run_mod.watch(active)
        rec = active.finish(code) or {}
        row: dict[str, Any] = {"engine": spec.engine, "model": spec.model.id, "seq_len": spec.train.seq_len,
                               "method": spec.method.kind, "overrides": combo, "status": rec.get("status"),
                               "record": str(active.record_path),
                               "spec": active.spec.to_dict()["train"]}  # the levers as the planner filled them
        if repeat > 1:
            row["repeat"] = (i - 1) // per_round + 1
        if dropped:
            row["native_only_left_out"] = dropped
        if rec.get("status") == "succeeded":
            row.update(summarize(spec, active.paths.events, warmup, peak))
            docs = doc_tokens(rec)
            if docs:
                row["doc_tokens"] = docs
        elif rec.get("failure"):
            row["failure"] = {k: rec["failure"].get(k) for k in ("rank", "cause", "message")}
        rows.append(row)
        if repeat > 1:
            result["repeats"] = repeat_spread(rows)
        result["loss_gaps"] = loss_gaps(rows)
        # Written after every row: a long sweep that is cut short keeps what it measured.
        write_results(result, out_dir, stem)
        if code in (run_mod.EXIT_CANCELLED, run_mod.EXIT_STOPPED):
            break  # Ctrl+C or SIGTERM (`timeout`, a scheduler) ends the sweep, not only its current row
    write_results(result, out_dir, stem)
    print_table(result, console)
    console.print(f"wrote {out_dir / stem}.json and .md")
    return result


def repeat_spread(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration run more than once: its tokens/s in each run and their spread, (max − min) / median."""
    groups: dict[tuple[str, ...], list[float]] = {}
    for r in rows:
        if r.get("status") == "succeeded" and r.get("tokens_per_s"):
            groups.setdefault(tuple(r["overrides"]), []).append(r["tokens_per_s"])
    return [{"overrides": list(k), "tokens_per_s": v,
             "spread": round((max(v) - min(v)) / statistics.median(v), 4)} for k, v in groups.items() if len(v) > 1]


def write_results(result: dict[str, Any], out_dir: Path, stem: str) -> None:
    from runner.writes import atomic_write_text

    for suffix, text in ((".json", json.dumps(result, indent=2) + "\n"), (".md", markdown(result))):
        atomic_write_text(out_dir / f"{stem}{suffix}", text)


COLUMNS = ("engine", "seq_len", "precision", "tokens_per_s", "last_loss", "mfu", "step_s_median", "step_s_spread", "data_wait_share",
           "peak_alloc_gib", "peak_reserved_gib", "docs", "split", "status")


def markdown(result: dict[str, Any]) -> str:
    gpu = result["gpu"]
    lines = [f"# Benchmark {result['created']}", "",
             f"- command: `{result['command']}`",
             f"- GPU: {gpu.get('name')} × {gpu.get('count')}, driver {gpu.get('driver')}"
             + (f"; ceiling for MFU {result['peak_tflops']} TFLOP/s" if result.get("peak_tflops") else ""),
             f"- versions: {', '.join(f'{k} {v}' for k, v in result['versions'].items() if v)}"]
    if result["rows"]:
        lines += [f"- {result['warmup_steps']} warm-up steps, then {result['steps']} measured; tokens/s is per GPU",
                  "", "| model | " + " | ".join(COLUMNS) + " |", "|" + " --- |" * (len(COLUMNS) + 1)]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | " + " | ".join(_value(r, c) for c in COLUMNS) + " |")
    if any(r.get("doc_tokens") for r in result["rows"]):
        lines += ["", "docs: tokens per document as trained (mean / p50 / p90 / max; a conversation split across "
                      "blocks counts as its pieces) and their count; split: pieces of split documents"]
    if result.get("repeats"):
        lines += ["", "## Repeats", "", "| configuration | tokens/s per run | spread (max − min) / median |",
                  "| --- | --- | --- |"]
        for g in result["repeats"]:
            runs = ", ".join(f"{v:,.0f}" for v in g["tokens_per_s"])
            lines.append(f"| {' '.join(g['overrides'])} | {runs} | {100 * g['spread']:.1f}% |")
    lines += gap_lines(result.get("loss_gaps") or [], "## Unequal learning")
    if "limits" in result:
        from runner.cli.bench_limit import markdown as limits_markdown

        lines += limits_markdown(result["limits"])
    return "\n".join(lines) + "\n"


def gap_lines(gaps: list[dict[str, Any]], heading: str) -> list[str]:
    """The pairs of rows whose losses after the same steps differ by more than LOSS_GAP, one line each."""
    if not gaps:
        return []
    lines = ["", heading, "", f"Losses after the same steps differ by more than {LOSS_GAP:.0%}: their tokens/s are "
             "not compared at equal learning.", ""]
    for g in gaps:
        share = f"{g['gap']:.1%}" if g.get("gap") is not None else "not a number"
        lines.append(f"- rows {g['rows'][0]} and {g['rows'][1]} at step {g['step']}: "
                     f"{_cell(g['losses'][0])} vs {_cell(g['losses'][1])} ({share}): "
                     f"`{' '.join(g['overrides'][0])}` / `{' '.join(g['overrides'][1])}`")
    return lines


def _value(row: dict[str, Any], column: str) -> str:
    docs = row.get("doc_tokens") or {}
    if column == "precision":
        return _cell((row.get("choices") or {}).get("optimizer_precision"))
    if column == "last_loss":
        loss = row.get("last_loss")
        return "-" if loss is None else f"{loss:.4f} @{row.get('last_step')}"
    if column == "docs":
        if not docs.get("count"):
            return "-"
        return f"{docs['mean']:,.0f} / {docs['p50']:,} / {docs['p90']:,} / {docs['max']:,} ({docs['count']:,})"
    if column == "split":
        return _cell(docs.get("split"))
    return _cell(row.get(column))


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.4g}" if v < 10 else f"{v:,.0f}"
    return str(v)


TITLES = {"tokens_per_s": "tok/s/GPU", "last_loss": "loss @step", "step_s_median": "step s", "step_s_spread": "spread", "data_wait_share": "data",
          "peak_alloc_gib": "alloc GiB", "peak_reserved_gib": "res GiB", "docs": "doc tokens mean/p50/p90/max (n)"}


def print_table(result: dict[str, Any], console: Console) -> None:
    table = Table(show_edge=False)
    for c in COLUMNS:
        table.add_column(TITLES.get(c, c), no_wrap=True)
    for r in result["rows"]:
        table.add_row(*[_value(r, c) for c in COLUMNS])
    console.print(table)
    for line in gap_lines(result.get("loss_gaps") or [], "Unequal learning:"):
        console.print(line, markup=False)
