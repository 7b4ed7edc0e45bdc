"""`runner bench --max-seq-len LO:HI[:STEP]`: the largest tokens per block that fits, per engine, found by
bisection over short real runs, beside the limit the estimator predicts for the same spec.

A probe is a 2-step run at one `train.seq_len`: the first step allocates the optimizer states and reaches the
backward peak, the second confirms it repeats. It fits when the run succeeds; it does not when a rank dies of a
CUDA out-of-memory error or, with offloaded activations, finds too little host memory to page-lock. Any other
failure stops the search (a crash is not a memory limit). Memory grows with the block length, so the fitting
lengths are a prefix of the grid and bisection needs log2(grid size) probes; started at the estimator's limit,
two when the estimate is right.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from runner.launch import run as run_mod
from runner.errors import UserError
from runner.spec import RunSpec

PROBE_STEPS = 2
MEMORY_CAUSES = ("cuda_oom", "host_oom")
"""Failures that mean 'does not fit': GPU memory, or host memory for offloaded activations."""


def parse_range(text: str) -> tuple[int, int, int]:
    """'LO:HI[:STEP]' → (lo, hi, step): block lengths lo, lo + step, ..., up to hi."""
    parts = text.split(":")
    try:
        values = [int(p.replace("_", "").replace(",", "")) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (2, 3) or min(values) <= 0:
        raise UserError(f"--max-seq-len expects LO:HI or LO:HI:STEP in tokens, got '{text}' "
                        "(e.g. --max-seq-len 32768:262144:4096)")
    lo, hi = values[0], values[1]
    step = values[2] if len(values) == 3 else lo
    if hi < lo:
        raise UserError(f"--max-seq-len: HI ({hi}) is below LO ({lo})")
    return lo, hi, step


def grid(lo: int, hi: int, step: int) -> list[int]:
    return list(range(lo, hi + 1, step))


def largest_fitting(lengths: list[int], fits: Callable[[int], bool | None],
                    start: int | None = None) -> tuple[int | None, bool]:
    """The largest length for which `fits` is true, assuming monotony; (None, ...) when even the first does not
    fit. `fits` returns None to stop the search (a failure that is not out-of-memory); the second value says
    whether the search completed.

    With `start` (an index, e.g. the estimator's limit) the first probe is there and the second its neighbour on
    the side the first points to: a right estimate is confirmed in two probes. Then it bisects what is left.
    """
    lo, hi = 0, len(lengths) - 1
    best = None
    hint, hinted = start, 0
    while lo <= hi:
        mid = hint if hint is not None and hinted < 2 and lo <= hint <= hi else (lo + hi) // 2
        ok = fits(lengths[mid])
        if ok is None:
            return best, False
        if ok:
            best = lengths[mid]
            lo = mid + 1
        else:
            hi = mid - 1
        if mid == hint:
            hint, hinted = (mid + 1 if ok else mid - 1), hinted + 1
    return best, True


def predicted_limit(spec: RunSpec, lengths: list[int]) -> int | None:
    """The estimator's answer on the same grid: the largest length whose verdict is not 'does not fit'."""
    from runner.plan import estimate

    def fits(n: int) -> bool:
        return estimate(spec.model_copy(update={"train": spec.train.model_copy(update={"seq_len": n})}),
                        suggest=False).fits

    return largest_fitting(lengths, fits)[0]


def probe_run(spec: RunSpec, runs_dir: Path, records_dir: Path) -> tuple[bool | None, dict[str, Any]]:
    """One short real run: (fits, what was seen). fits is None for a failure other than out-of-memory."""
    active = run_mod.start(spec, runs_dir, records_dir)
    code = run_mod.watch(active)
    rec = active.finish(code) or {}
    seen: dict[str, Any] = {"seq_len": spec.train.seq_len, "status": rec.get("status"),
                            "record": str(active.record_path), "run_dir": str(active.paths.run_dir)}
    # Each rank's own peak (allocated and reserved on a GPU, RSS on CPU), from its end event; the largest rank's.
    peaks = [r["peak_mem"] for r in ((rec.get("metrics") or {}).get("per_rank") or {}).values() if r.get("peak_mem")]
    if peaks:
        seen["peak_mem_gib"] = max(peaks, key=lambda p: max(p.values()))
    if rec.get("status") == "succeeded":
        return True, seen
    failure = rec.get("failure") or {}
    seen["failure"] = {k: failure.get(k) for k in ("rank", "cause", "message")}
    if failure.get("cause") in MEMORY_CAUSES:
        return False, seen
    return None, seen


def find_limits(specs: dict[str, RunSpec], lengths: list[int], runs_dir: Path, records_dir: Path,
                console: Console, probe: Callable[..., tuple[bool | None, dict[str, Any]]] = probe_run,
                ) -> dict[str, Any]:
    """Per engine: every probe, the measured and the predicted limit, and the estimator's error on it."""
    out: dict[str, Any] = {"grid": [lengths[0], lengths[-1], lengths[1] - lengths[0] if len(lengths) > 1 else 0],
                           "engines": {}}
    for engine, spec in specs.items():
        probes: list[dict[str, Any]] = []

        def fits(n: int) -> bool | None:
            s = spec.model_copy(update={"train": spec.train.model_copy(update={"seq_len": n,
                                                                               "max_steps": PROBE_STEPS})})
            console.print(f"bench --max-seq-len: {engine} at {n:,} tokens per block")
            ok, seen = probe(s, runs_dir, records_dir)
            probes.append(seen)
            verdict = "fits" if ok else ("out of memory" if ok is False else "failed: search stopped")
            console.print(f"  {verdict}")
            return ok

        predicted = predicted_limit(spec, lengths)
        start = lengths.index(predicted) if predicted is not None else 0
        measured, complete = largest_fitting(lengths, fits, start=start)
        row: dict[str, Any] = {"measured_max_seq_len": measured, "search_complete": complete,
                               "predicted_max_seq_len": predicted, "probes": probes,
                               "spec": spec.to_dict()["train"]}  # what every probe ran, but its seq_len
        if measured and predicted:
            row["prediction_error"] = round((predicted - measured) / measured, 4)
        if measured == lengths[-1]:
            row["note"] = "the largest length tried fits: the limit is above the range"
        out["engines"][engine] = row
    native, trl = (out["engines"].get(e, {}).get("measured_max_seq_len") for e in ("native", "trl"))
    if native and trl:
        out["native_over_trl"] = round(native / trl, 3)
    return out


def markdown(limits: dict[str, Any]) -> list[str]:
    lines = ["", "## Largest tokens per block that fits", "",
             "| engine | measured | predicted | prediction error | probes | complete |", "| --- | --- | --- | --- | --- | --- |"]
    for engine, r in limits["engines"].items():
        err = r.get("prediction_error")
        lines.append(f"| {engine} | {r['measured_max_seq_len'] or '-'} | {r['predicted_max_seq_len'] or '-'} | "
                     f"{'-' if err is None else f'{100 * err:+.1f}%'} | {len(r['probes'])} | "
                     f"{'yes' if r['search_complete'] else 'no'} |")
    if "native_over_trl" in limits:
        lines += ["", f"native / trl: {limits['native_over_trl']}×"]
    return lines
