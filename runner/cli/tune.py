"""`runner tune`: the planner's choice of speed levers for a spec, optionally checked by short runs on this machine,
written out as a recipe."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from runner.errors import UserError
from runner.writes import atomic_write_text
from runner.spec import RunSpec, apply_override, find_spec_file, read_spec_file, resolve

PROBE_STEPS = 3
"""Steps of each probe run: the first (compilation, allocator warm-up) is not timed."""


def all_rows(est: Any) -> list[dict[str, Any]]:
    """The chosen levers, then the runners-up, each with its predicted step_s, per_gpu_gib and fits."""
    return [{**est.levers, "step_s": est.step_s, "per_gpu_gib": est.per_gpu_gib, "fits": est.fits},
            *est.runners_up]


def candidates(est: Any, k: int) -> list[tuple[int, dict[str, Any]]]:
    """(index in all_rows, row) of the chosen levers and the runners-up that fit, fastest first, at most k."""
    return [(i, r) for i, r in enumerate(all_rows(est)) if r["fits"]][:k]


def levers_of_row(row: dict[str, Any]) -> Any:
    from runner.plan.autotune import Levers

    names = {f.name for f in dataclasses.fields(Levers)}
    return Levers(**{k: v for k, v in row.items() if k in names})


def lever_fields(row: dict[str, Any], spec: RunSpec, layers: int) -> dict[str, Any]:
    """A candidate row's levers as spec train fields (runner.plan.autotune.Levers.train_fields)."""
    return levers_of_row(row).train_fields(spec.engine, layers)


def with_levers(spec: RunSpec, fields: dict[str, Any]) -> RunSpec:
    data = spec.to_dict()
    data["train"].update(fields)
    return RunSpec.model_validate(data)


def probe(spec: RunSpec, runs_dir: Path, records_dir: Path) -> dict[str, Any]:
    """A short run of one candidate through the usual launcher (runner bench's probe): whether it fit, and its
    median step after the first."""
    from runner.cli.bench import summarize
    from runner.cli.bench_limit import probe_run

    short = spec.model_copy(update={"train": spec.train.model_copy(update={"max_steps": PROBE_STEPS,
                                                                           "log_every": 1, "checkpoint_every": 0})})
    ok, seen = probe_run(short, runs_dir, records_dir)
    out: dict[str, Any] = {"fits": ok, "status": seen.get("status"), "record": seen.get("record")}
    if seen.get("failure"):
        out["failure"] = seen["failure"]
    if ok:
        row = summarize(short, Path(seen["run_dir"]) / "events", 1, None)
        out["step_s"] = row.get("step_s_median")
        out["peak_mem_gib"] = seen.get("peak_mem_gib")
    return out


def tuned_recipe(spec_ref: str, overrides: list[str], fields: dict[str, Any], why: str) -> str:
    """The spec as written (file and --set), with the chosen levers set: YAML for recipes/."""
    data = read_spec_file(find_spec_file(spec_ref))
    for assignment in overrides:
        apply_override(data, assignment)
    data.setdefault("train", {}).update(fields)
    return f"# Tuned by `runner tune`: {why}\n" + yaml.safe_dump(data, sort_keys=False)


def _fits_cell(est: Any, row: dict[str, Any], chosen: bool) -> str:
    """One verdict for every row: "yes" within the planner's margin (hardware.headroom_gib), "tight" on the GPU but
    inside that margin, "no". The chosen row's `fits` is the estimate's (the whole GPU), the others' the planner's
    (its margin), so a chosen row that is tight read "yes" beside runners-up of the same size that read "no"."""
    if chosen:
        return {"fits": "yes", "tight": "tight"}.get(est.verdict, "no")
    if row["fits"]:
        return "yes"
    return "tight" if row["per_gpu_gib"] <= est.gpu_memory_gib else "no"


def print_plan(console: Console, est: Any, rows: list[dict[str, Any]] | None = None) -> None:
    console.print(f"levers: {est.levers_reason}")
    table = Table(show_header=True, title="candidates, fastest first (predicted)")
    for col in ("levers", "step s", "GiB", "fits", *(("measured step s",) if rows else ())):
        table.add_column(col, justify="left" if col == "levers" else "right")
    for i, row in enumerate(all_rows(est)):
        levers = levers_of_row(row)
        measured = []
        if rows:
            got = next((r for r in rows if r["index"] == i), None)
            measured = ["-" if got is None else f"{got['step_s']:.3f}" if got.get("step_s") else
                        ("OOM" if got.get("fits") is False else got.get("status") or "failed")]
        table.add_row(levers.describe(est.arch["layers"]), f"{row['step_s']:.3f}", f"{row['per_gpu_gib']:.1f}",
                      _fits_cell(est, row, chosen=i == 0), *measured)
    console.print(table)


def tune(spec_ref: str, overrides: list[str], k: int, out: Path | None, runs_dir: Path, records_dir: Path,
         console: Console) -> int:
    from runner.plan import estimate
    from runner.spec import load_spec

    if k < 0:
        raise UserError(f"--probe expects the number of candidates to run (1 or more), got {k}")
    spec = load_spec(spec_ref, overrides)
    est = estimate(spec, suggest=False)
    chosen = {**est.levers}
    why = est.levers_reason
    probed: list[dict[str, Any]] = []
    layers = est.arch["layers"]
    if k:
        resolved = resolve(spec)
        pool = candidates(est, k)
        if not pool:
            raise UserError("no candidate is predicted to fit: nothing to probe (runner estimate says why)")
        for index, row in pool:
            console.print(f"probe {len(probed) + 1}/{len(pool)}: {row_description(row, est)}")
            result = probe(with_levers(resolved, lever_fields(row, resolved, layers)), runs_dir, records_dir)
            probed.append({**row, "index": index, "predicted_step_s": row["step_s"], **result})
            console.print(f"  {result['step_s']:.3f} s a step" if result.get("fits") and result.get("step_s") else
                          "  out of memory: does not fit" if result.get("fits") is False else
                          f"  failed ({result.get('status')}): not counted")
        ran = [p for p in probed if p["fits"] and p["step_s"]]
        if not ran:
            raise UserError("every probe failed or ran out of memory: see the records above")
        best = min(ran, key=lambda p: p["step_s"])
        chosen = {f: best[f] for f in est.levers}
        why = f"{row_description(best, est)}: the fastest of {len(probed)} measured ({best['step_s']:.3f} s a step)"
    print_plan(console, est, probed or None)
    console.print(f"chosen: {why}")
    if out is not None:
        fields = lever_fields(chosen, spec, layers)
        atomic_write_text(out, tuned_recipe(spec_ref, overrides, fields, why))
        console.print(f"wrote {out}")
    return 0


def row_description(row: dict[str, Any], est: Any) -> str:
    return levers_of_row(row).describe(est.arch["layers"])
