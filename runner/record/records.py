"""Run records: written at launch, finished atomically at exit, locked with a sha256 of their canonical JSON."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypedDict

from runner.events.paths import RunPaths
from runner.data import doclengths
from runner.events.failure import Failure
from runner.errors import UserError
from runner.events.lines import EndEvent, Event, StartEvent, TrainBeginEvent, events_of, first_event, latest_evals, latest_samples, latest_steps, read_events
from runner.facts.flops import utilisation
from runner.record.schema import PREFIX, SCHEMA, VERSION, migrate, version_of
from runner.writes import atomic_write_json, redact


class RankMetrics(TypedDict, total=False):
    """One rank's figures, from its event file."""

    last_step: int
    peak_mem_gib: float | None
    """The largest `mem_gib` of its step lines (allocated on GPU, RSS on CPU)."""
    peak_mem: dict[str, float]
    """Its end event's `peak_mem_gib`: {allocated, reserved} on GPU, {rss} on CPU."""
    train_s: float
    tokens: int
    data: dict[str, Any]
    export: Any
    trainable_params: int
    params: int
    fsdp_sharded: bool


class Metrics(TypedDict, total=False):
    """What a finished run measured (metrics_from_events, plus wall_s)."""

    steps: int
    loss_curve: dict[str, list[list[float]]]
    final_loss: float | None
    first_loss: float | None
    final_global_loss: float
    tokens: int
    train_s: float | None
    tokens_per_s: float | None
    mfu: float | None
    """(model + attention FLOPs) / (train_s × the GPUs' matmul ceiling): runner/facts/flops.py."""
    per_rank: dict[str, RankMetrics]
    data_fingerprint: str
    export: Any
    trainable_params: int
    params: int
    wall_s: float


class RunRecord(TypedDict, total=False):
    """records/<id>.json (the design's record contract); `lock` covers everything else."""

    schema: str
    id: str
    created: str
    finished: str | None
    status: str
    spec: dict[str, Any]
    pins: dict[str, Any]
    launch: dict[str, Any]
    estimate: dict[str, Any] | None
    """`Estimate.to_dict()` of runner.plan, as predicted at launch."""
    metrics: Metrics | None
    failure: Failure | None
    run_dir: str
    replay_of: str
    decisions: dict[str, Any]
    """The run's decisions file whole (schema 3; runner.decide), given whole to a replay's ranks; a schema-2 record's
    are what its rank 0 reported, pinned field by field (runner.record.schema)."""
    quantization: dict[str, Any]
    """method.kind=qlora: how rank 0 stored the frozen base (its train_begin's `quantization`)."""
    migrated_from: str
    """The schema the record was stored in, when load() migrated it (never stored)."""
    exit_code: int
    lock: str


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def compute_lock(record: dict[str, Any]) -> str:
    return hashlib.sha256(canonical({k: v for k, v in record.items() if k != "lock"})).hexdigest()


def save(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Redact, lock and write a record atomically; returns what was written."""
    record = redact(json.loads(json.dumps(_finite(record))))
    record.pop("migrated_from", None)  # what load() read it as; once saved it is in the current schema
    record["lock"] = compute_lock(record)
    atomic_write_json(path, record)
    return record


def _finite(x: Any) -> Any:
    """NaN/inf are not JSON: store them as None (a NaN loss is reported by status, not by the number)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_record(run_id: str, spec: dict[str, Any], pins: dict[str, Any], launch: dict[str, Any],
               estimate: dict[str, Any] | None, run_dir: Path, replay_of: str | None = None) -> RunRecord:
    rec: RunRecord = {
        "schema": SCHEMA,
        "id": run_id,
        "created": now_iso(),
        "finished": None,
        "status": "running",
        "spec": spec,
        "pins": pins,
        "launch": launch,
        "estimate": estimate,
        "metrics": None,
        "failure": None,
        "run_dir": str(run_dir),
    }
    if replay_of:
        rec["replay_of"] = replay_of
    return rec


class RecordError(UserError):
    pass


def load(path: Path) -> RunRecord:
    """Read a record in the current schema (an older one is migrated, in memory: runner.record.schema), with a
    one-line reason for anything that is not one."""
    return _migrated(path, load_stored(path))


def _migrated(path: Path, rec: dict[str, Any]) -> RunRecord:
    try:
        return migrate(rec)  # type: ignore[return-value]
    except (AttributeError, KeyError, TypeError, ValueError) as e:  # a field of the wrong shape for its schema
        raise RecordError(f"{path}: a {rec['schema']} record whose content does not migrate to {SCHEMA} "
                          f"({type(e).__name__}: {e}); is it hand-edited?") from None


def load_stored(path: Path) -> dict[str, Any]:
    """A record as stored, in whatever known schema it was written; a one-line reason for anything that is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordError(f"{path}: no such record file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}: cannot read ({e})") from None
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError(f"{path}: not valid JSON (truncated or corrupted at line {e.lineno}, column {e.colno})") \
            from None
    if not isinstance(rec, dict) or "schema" not in rec:
        raise RecordError(f"{path}: not a run record (no 'schema' field)")
    version = version_of(rec["schema"])
    if version is None or version > VERSION:
        newer = " (written by a newer sft-tui: upgrade it)" if version else ""
        raise RecordError(f"{path}: unknown record schema {rec['schema']!r}{newer}; this runner reads "
                          f"{PREFIX}1 to {SCHEMA}")
    return rec


def verify(path: Path) -> tuple[bool, str]:
    """The lock is over the content as written: check it on the stored record, then that the record migrates."""
    rec = load_stored(path)
    lock = rec.get("lock")
    if not lock:
        return False, f"{path}: record has no lock (it was not finished)"
    actual = compute_lock(rec)
    if actual != lock:
        return False, (f"{path}: lock mismatch: content changed after it was locked "
                       f"(sha256 {actual[:12]}… ≠ {lock[:12]}…)")
    _migrated(path, rec)
    old = f", schema {rec['schema']}, read as {SCHEMA}" if rec["schema"] != SCHEMA else ""
    return True, f"{path}: ok ({rec['status']}, lock {lock[:12]}…{old})"


def list_records(records_dir: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted(records_dir.glob("*.json")):
        try:
            out.append(load(p))
        except RecordError:
            continue
    return out


def find_record(ref: str, records_dir: Path) -> Path:
    """A record path, or an id (or unique id prefix) in the records folder."""
    p = Path(ref)
    if p.suffix == ".json" or os.sep in ref:
        return p
    exact = records_dir / f"{ref}.json"
    if exact.exists():
        return exact
    hits = sorted(records_dir.glob(f"{ref}*.json"))
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise RecordError(f"no record '{ref}' in {records_dir}")
    raise RecordError(f"'{ref}' matches {len(hits)} records in {records_dir}: give more of the id")


def load_record(ref: str, records_dir: Path) -> dict[str, Any]:
    """A record by path or id, as `runner` commands take it."""
    try:
        return dict(load(find_record(ref, records_dir)))
    except RecordError as e:
        raise UserError(str(e)) from None


# ---------------------------------------------------------------------------------------------
# Metrics from the event files


@dataclass(frozen=True)
class RunFlops:
    """What MFU needs from the run's model and GPU (runner/facts/flops.py)."""

    model_per_token: float
    attention_per_doc_len_sq: float
    ceiling_tflops: float



def metrics_from_events(events_dir: Path, world_size: int, device: str, flops: RunFlops | None = None
                        ) -> Metrics:
    """Per-rank loss curves, last steps, tokens/s, peak memory, MFU and the data fingerprint, from rank<r>.jsonl."""
    per_rank: dict[str, RankMetrics] = {}
    curves: dict[str, list[list[float]]] = {}
    wall = []
    tokens_total = 0
    doc_len_sq: int | None = 0  # Σ doc_len² over every rank's steps, for the attention FLOPs (None: not reported)
    fingerprint = hashlib.sha256()
    doc_hists: dict[str, Any] = {}  # rank → its documents' length histogram (end event data.doc_lengths)
    for r in range(world_size):
        evs = read_events(RunPaths.of_events(events_dir).rank_events(r))
        steps = latest_steps(evs)  # a resumed run's repeated steps: the last line counts (StepIndex)
        ends: list[EndEvent] = events_of(evs, EndEvent)
        start: StartEvent | None = first_event(evs, StartEvent)
        curves[str(r)] = [[e.step, e.loss] for e in steps]
        if doc_len_sq is not None and steps and all(e.get("doc_len_sq") for e in steps):
            doc_len_sq += sum(e["doc_len_sq"] for e in steps)
        else:
            doc_len_sq = None
        info: RankMetrics = {"last_step": steps[-1].step if steps else 0,
                             "peak_mem_gib": max((e.mem_gib or 0 for e in steps), default=None)}
        if ends:
            end = ends[-1]
            # Each launch (the first, then every resume) reports its own tokens and time.
            info["train_s"] = round(sum(e.train_s or 0.0 for e in ends), 3)
            info["tokens"] = sum(e.tokens or 0 for e in ends)
            info["data"] = _without_histogram(end.data, doc_hists, str(r))
            info["peak_mem"] = end.get("peak_mem_gib")
            for key in ("export", "trainable_params", "params", "fsdp_sharded"):
                if getattr(end, key) is not None:
                    info[key] = getattr(end, key)
            tokens_total += info["tokens"]
            if info["train_s"]:
                wall.append(info["train_s"])
            if end.data:
                fingerprint.update(str(end.data.get("fingerprint")).encode())
        elif steps:
            tokens_total += sum(e.tokens or 0 for e in steps)
            if start and start.t is not None and steps[-1].t is not None:
                wall.append(steps[-1].t - start.t)
        per_rank[str(r)] = info
    rank0 = [point for point in curves.get("0") or [] if point[1] is not None]
    train_s = max(wall) if wall else None
    tokens_per_s = tokens_total / train_s if train_s else None
    out: Metrics = {
        "steps": max((i["last_step"] for i in per_rank.values()), default=0),
        "loss_curve": curves,
        # Rank 0's own loss until the global one is known below (older events lack it).
        "final_loss": rank0[-1][1] if rank0 else None,
        "first_loss": rank0[0][1] if rank0 else None,
        "tokens": tokens_total,
        "train_s": train_s,
        "tokens_per_s": round(tokens_per_s, 2) if tokens_per_s else None,
        "mfu": None,
        "per_rank": per_rank,
        "data_fingerprint": fingerprint.hexdigest(),
    }
    rank0_info = per_rank.get("0") or {}
    for key in ("export", "trainable_params", "params"):
        if key in rank0_info:
            out[key] = rank0_info[key]
    rank0_events = read_events(RunPaths.of_events(events_dir).rank_events(0))
    global_losses = global_loss_curve(rank0_events)
    if global_losses:
        # The loss over every rank's target tokens: defined whenever any rank had a target, unlike one rank's.
        out["final_global_loss"] = out["final_loss"] = global_losses[-1][1]
        out["first_loss"] = global_losses[0][1]
    out.update(eval_metrics(rank0_events, per_rank))
    out.update(sample_metrics(rank0_events))
    packing = packing_metrics(per_rank, doc_hists)
    if packing:
        out["packing"] = packing
    if device == "cuda" and flops is not None and train_s and tokens_total:
        # MFU (runner/facts/flops.py): model FLOPs + attention FLOPs (when the engine reports its documents' lengths).
        done = flops.model_per_token * tokens_total + flops.attention_per_doc_len_sq * (doc_len_sq or 0)
        out["mfu"] = round(utilisation(done, train_s, flops.ceiling_tflops, world_size), 4)
    return out


def eval_metrics(rank0_events: list[Event], per_rank: dict[str, Any]) -> dict[str, Any]:
    """eval_curve (step → global eval loss, as a string-keyed map), eval_accuracy, the best and last eval, and
    whether the run stopped early; empty when the run evaluated nothing."""
    evals = latest_evals(rank0_events)  # a resumed run evaluates again: the last line of a step counts
    if not evals:
        return {}
    curve = {str(e.step): e.loss for e in evals}
    finite = [(e.step, e.loss) for e in evals if e.loss is not None]
    out: dict[str, Any] = {"eval_curve": curve,
                           "eval_accuracy": {str(e.step): e.accuracy for e in evals},
                           "final_eval_loss": evals[-1].loss,
                           "eval_target_tokens": evals[-1].target_tokens}
    if finite:
        best = min(finite, key=lambda x: x[1])
        out["best_eval_loss"], out["best_eval_step"] = best[1], best[0]
    ends: list[EndEvent] = events_of(rank0_events, EndEvent)
    stopped = ends[-1].stopped_early if ends else None
    out["stopped_early"] = stopped  # the step where early stopping ended the run, or None
    return out


def sample_metrics(rank0_events: list[Event]) -> dict[str, Any]:
    """samples: the model's answers to train.eval_prompts (step, index, prompt, text; the last line of a step
    counts), which replay compares; empty when the run has no prompts."""
    samples = latest_samples(rank0_events)
    if not samples:
        return {}
    return {"samples": [{"step": e.step, "index": e.index, "prompt": e.prompt, "text": e.text} for e in samples]}


def _without_histogram(data: Any, hists: dict[str, Any], rank: str) -> Any:
    """A rank's end-event data without its documents' length histogram, which goes to `hists` for the merge (the
    record keeps each rank's summary, `doc_tokens`, and the merged one in metrics.packing)."""
    if not isinstance(data, dict) or "doc_lengths" not in data:
        return data
    data = dict(data)
    hists[rank] = data.pop("doc_lengths")
    return data


def packing_metrics(per_rank: dict[str, Any], doc_hists: dict[str, Any] | None = None) -> dict[str, Any]:
    """Blocks, split conversations and packing efficiency of the blocks the steps trained on, summed over ranks (each
    rank's end event's data; real_tokens is metrics.tokens), the blocks drawn but skipped for having no target token
    and why, and the lengths of the documents as trained (`doc_tokens`: count, tokens, mean, p50, p90, max over every rank; a split
    document counts as the pieces that trained)."""
    data = [i["data"] for i in per_rank.values() if isinstance(i.get("data"), dict)]
    if not data:
        return {}
    hists = doc_hists or {}
    docs = doclengths.merged_summary([{**i["data"], "doc_lengths": hists.get(r)} for r, i in per_rank.items()
                                      if isinstance(i.get("data"), dict)])
    blocks = sum(d.get("blocks") or 0 for d in data)
    real = sum(d.get("real_tokens") or 0 for d in data)
    out = {"blocks": blocks, "examples": sum(d.get("examples") or 0 for d in data),
           "split_documents": sum(d.get("split_documents") or 0 for d in data), "real_tokens": real}
    skipped = {k: sum(d.get(k) or 0 for d in data) for k in ("skipped_no_target_blocks", "skipped_no_target_tokens")}
    if skipped["skipped_no_target_blocks"]:
        out.update(skipped)
        out["skipped"] = (f"{skipped['skipped_no_target_blocks']} block(s), {skipped['skipped_no_target_tokens']} "
                          "tokens, not trained: no rank's blocks of that step held a target token")
    effs = [(d.get("packing_efficiency"), d.get("blocks") or 0) for d in data if d.get("packing_efficiency")]
    if effs and blocks:
        out["packing_efficiency"] = round(sum(e * b for e, b in effs) / blocks, 4)
    if docs is not None:
        out["doc_tokens"] = docs
    return out


def global_loss_curve(events: list[Event]) -> list[tuple[int, float]]:
    """(step, global loss) of the steps that had a target on some rank; a non-finite one is kept as NaN."""
    return [(e.step, v if math.isfinite(v) else math.nan) for e in latest_steps(events)
            if (v := e.number("global_loss")) is not None]


def compare_curves(a: dict[str, list[list[float]]], b: dict[str, list[list[float]]]) -> dict[str, Any]:
    """Max |loss difference| over every rank and step, and the earliest step (over all ranks) where they differ."""
    max_diff = 0.0
    diverging: list[tuple[int, int, Any, Any]] = []
    same_steps = set(a) == set(b)
    for r in sorted(set(a) | set(b), key=int):
        ca = {int(s): loss for s, loss in a.get(r, [])}
        cb = {int(s): loss for s, loss in b.get(r, [])}
        same_steps &= set(ca) == set(cb)
        for s in sorted(set(ca) & set(cb)):
            la, lb = ca[s], cb[s]
            d = abs(la - lb) if la is not None and lb is not None else (0.0 if la == lb else math.inf)
            max_diff = max(max_diff, d)
            if d > 0:
                diverging.append((s, int(r), la, lb))
    first = None
    if diverging:
        s, r, la, lb = min(diverging)
        first = {"rank": r, "step": s, "original": la, "replay": lb}
    return {"max_abs_loss_diff": max_diff, "first_divergence": first, "same_steps": same_steps}


def quantization_from_events(events_dir: Path) -> dict[str, Any] | None:
    """How rank 0 stored the frozen base of a QLoRA run (its train_begin's `quantization`: type, block sizes,
    library and version, what stayed in its own dtype); None otherwise."""
    begin = first_event(read_events(events_dir / "rank0.jsonl"), TrainBeginEvent)
    return begin.quantization if begin is not None else None
