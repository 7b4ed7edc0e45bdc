"""Replay: rebuild the spec from a record, report pin drift, re-run, and compare the loss curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

from runner.record import pins as pins_mod
from runner.errors import UserError
from runner.record.records import compare_curves
from runner.record.schema import schema1_decisions
from runner.spec import ModelSpec, RunSpec, TrainSpec, validate
from runner.versions import NUMERIC

SECTIONS = {"model": ModelSpec, "train": TrainSpec}

# Pins that, when they differ, can change the numbers; --strict refuses to replay over any of them.
STRICT_KEYS = ("packages", "torch", "cuda", "model", "dataset", "tokenizer_sha256")


PINNED = {"attn": ("model", "attn_implementation"), "attn_kernel": ("model", "varlen_kernel"),
          "loss_impl": ("train", "loss_impl"), "optimizer_precision": ("train", "optimizer_precision")}
"""The engine decisions a replay pins (a record's `decisions`), and the spec field that makes an engine decide the
same: a value the field does not take (TRL's own fused loss) is not pinned. Whether one rank was wrapped in FSDP2
(`fsdp_sharded`) pins train.fsdp_one_rank; more ranks are always wrapped."""


def pinned_decisions(rec: dict[str, Any]) -> dict[str, Any]:
    """{spec field: value} that makes a replay decide as the recorded run did: its `decisions` (schema 2), or for a
    record read without them what its schema-1 content says (`schema1_decisions`). A decision the record does not hold
    is left to today's rules."""
    decisions = rec["decisions"] if "decisions" in rec else schema1_decisions(rec)
    out: dict[str, Any] = {}
    for key, (section, name) in PINNED.items():
        value = decisions.get(key)
        if value is not None and value in get_args(SECTIONS[section].model_fields[name].annotation):
            out[f"{section}.{name}"] = value
    sharded = decisions.get("fsdp_sharded", decisions.get("fsdp"))
    if sharded is not None and _ranks(rec) in (1, None):
        out["train.fsdp_one_rank"] = bool(sharded)
    return out


def recorded_decisions(rec: dict[str, Any]) -> Any:
    """The run's whole decisions (a schema-3 record's, runner.decide.Decisions), which a replay gives its ranks
    rather than deciding again; None for a record written before (its ranks' reported choices are pinned through
    the spec, `pinned_decisions`, and today's rules decide the rest)."""
    from runner.decide.decisions import FORMAT, Decisions

    decisions = rec.get("decisions") or {}
    return Decisions.from_dict(decisions) if decisions.get("format") == FORMAT else None


def _ranks(rec: dict[str, Any]) -> int | None:
    """How many ranks the recorded run had: its launch, else its per-rank metrics, else None (not known: pinning
    train.fsdp_one_rank then is harmless, as more ranks are wrapped whatever it says)."""
    world = (rec.get("launch") or {}).get("world_size")
    per_rank = (rec.get("metrics") or {}).get("per_rank")
    return world if isinstance(world, int) else len(per_rank) if per_rank else None


def spec_from_record(rec: dict[str, Any], trust_remote_code: bool = False) -> RunSpec:
    """The record's resolved spec with the engine's recorded decisions pinned (`pinned_decisions`: the replay runs
    as the original did, not as today's rules would decide); never runs code from the record without explicit
    consent."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in rec["spec"].items()}
    for field, value in pinned_decisions(rec).items():
        section, name = field.split(".")
        data.setdefault(section, {})[name] = value
    train = data.setdefault("train", {})
    if "packing_strategy" not in train:
        # Recorded before packing strategies: blocks were cut where they filled (wrapped).
        train["packing_strategy"] = "wrapped"
    spec = validate(data)
    if spec.model.trust_remote_code and not trust_remote_code:
        raise UserError(f"record {rec['id']} asks for model.trust_remote_code: replay would run the model repo's own "
                        "code; pass --trust-remote-code if you trust it")
    return spec


def drift(recorded: dict[str, Any], current: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pin that differs: [{pin, recorded, current, strict}]."""
    rows: list[dict[str, Any]] = []

    def add(name: str, a: Any, b: Any, strict: bool) -> None:
        if a != b:
            rows.append({"pin": name, "recorded": a, "current": b, "strict": strict})

    # What changes the numbers first (the interpreter, torch and CUDA, the model libraries, the kernels, the
    # tokenizer, model and data), then every other package, then where it ran.
    add("python", recorded.get("python"), current.get("python"), True)
    for key in ("torch", "cuda", "cudnn", "nccl"):
        add(key, recorded.get(key), current.get(key), key in STRICT_KEYS)
    ra, ca = recorded.get("packages", {}), current.get("packages", {})
    numeric = [n for n in NUMERIC if n != "torch"]
    for name in numeric:
        add(f"package {name}", ra.get(name), ca.get(name), True)
    add("tokenizer_sha256", recorded.get("tokenizer_sha256"), current.get("tokenizer_sha256"), True)
    for src in ("model", "dataset"):
        r, c = recorded.get(src, {}), current.get(src, {})
        for k in ("commit", "content_sha256"):
            add(f"{src} {k}", r.get(k), c.get(k), True)
    for name in sorted((set(ra) | set(ca)) - set(numeric)):
        add(f"package {name}", ra.get(name), ca.get(name), True)
    for key in ("interpreter", "pythonpath"):
        if key in recorded:  # recorded since the record pins which copy of a package ran
            add(key, recorded.get(key), current.get(key), False)
    rg, cg = recorded.get("git", {}), current.get("git", {})
    add("git commit", rg.get("commit"), cg.get("commit"), False)
    add("git dirty", rg.get("dirty"), cg.get("dirty"), False)
    add("git diff", rg.get("diff_sha256"), cg.get("diff_sha256"), False)
    add("gpus", recorded.get("gpus", {}).get("names"), current.get("gpus", {}).get("names"), False)
    add(CPU_PIN, recorded.get("system", {}).get("cpu"), current.get("system", {}).get("cpu"), False)
    add("driver", recorded.get("gpus", {}).get("driver"), current.get("gpus", {}).get("driver"), False)
    return rows


def folds(row: dict[str, Any]) -> bool:
    """Whether a drift row is one of the packages that do not change the numbers (shown as a count)."""
    return row["pin"].startswith("package ") and row["pin"].removeprefix("package ") not in NUMERIC


def current_pins(spec: RunSpec, repo_dir: Path) -> dict[str, Any]:
    p = pins_mod.capture(spec, repo_dir)
    p["git"].pop("diff", None)
    return p


CPU_PIN = "cpu"
"""The drift row of the CPU model a run was recorded on (system.cpu)."""

OTHER_CPU_TOLERANCE = 1e-4
"""|Δloss| a CPU replay on another CPU model is held to: torch's CPU kernels take the vector paths the CPU has
(AVX-512 or AVX2, with or without FMA), whose float sums round differently (docs/records-and-replay.md gives the
difference found between an Intel Xeon and an AMD EPYC)."""


def tolerance(spec: RunSpec, drift_rows: list[dict[str, Any]] | None = None) -> float:
    """CPU fp32 with fixed threads is bit-exact on the CPU model it was recorded on (OTHER_CPU_TOLERANCE on another,
    as `drift_rows` say); GPU runs are exact only with the deterministic switches on."""
    if spec.hardware.device == "cpu" and any(r["pin"] == CPU_PIN for r in drift_rows or []):
        return OTHER_CPU_TOLERANCE
    if spec.hardware.device == "cpu" or spec.train.deterministic:
        return 0.0
    return 1e-3


def compare(original: dict[str, Any], replay: dict[str, Any], tol: float) -> dict[str, Any]:
    """Whether the replay reproduced the original, and `message`: one sentence saying what was compared.

    Loss curves are compared only where both runs trained: a failed original is reproduced by the same failure
    at the same step (and the same curve before it), a cancelled original by the same curve over the steps it
    ran, and a cancelled replay is not compared at all.
    """
    a = (original.get("metrics") or {}).get("loss_curve") or {}
    b = (replay.get("metrics") or {}).get("loss_curve") or {}
    status_a, status_b = original.get("status"), replay.get("status")
    if status_a == "cancelled":
        kept = {r: {s for s, _ in c} for r, c in a.items()}
        b = {r: [p for p in c if p[0] in kept.get(r, set())] for r, c in b.items()}
    result = compare_curves(a, b)
    result["tolerance"] = tol
    steps = _steps(original)
    curve_ok = result["same_steps"] and result["max_abs_loss_diff"] <= tol
    result["compared"] = status_b != "cancelled"
    if status_b == "cancelled":
        result["reproduced"] = False
        result["message"] = f"the replay was cancelled after {_steps(replay)} steps; not compared"
    elif status_a == "failed" or status_b == "failed":
        same = status_a == status_b == "failed" and _failure(original) == _failure(replay)
        result["reproduced"] = same and curve_ok
        verdict = "same failure" if same else "a different outcome"
        if same and not curve_ok:
            verdict = "same failure, but the loss curves before it differ"
        result["message"] = f"the original {_outcome(original)}; the replay {_outcome(replay)}: {verdict}"
    elif not steps or not any(a.values()):
        result["reproduced"] = False
        result["message"] = f"the original {_outcome(original)}: no loss curve to compare"
    else:
        result["reproduced"] = curve_ok
        over = f"the {steps} steps the original ran before it was cancelled" if status_a == "cancelled" \
            else "every rank and step"
        result["message"] = (f"{'reproduced' if curve_ok else 'not reproduced'}: max |Δloss| = "
                             f"{result['max_abs_loss_diff']:g} over {over} (tolerance {tol:g})")
        if not result["same_steps"]:
            result["message"] += f"; the replay logged other steps ({_steps(replay)} against {steps})"
    # The eval curve, when the original has one, is held to the same tolerance: one more curve to reproduce.
    ea = (original.get("metrics") or {}).get("eval_curve")
    if ea:
        eb = (replay.get("metrics") or {}).get("eval_curve") or {}
        ev = compare_curves({"0": [[int(s), v] for s, v in ea.items()]}, {"0": [[int(s), v] for s, v in eb.items()]})
        result["max_abs_eval_loss_diff"] = ev["max_abs_loss_diff"]
        result["eval_first_divergence"] = ev["first_divergence"]
        result["eval_same_steps"] = ev["same_steps"]
        eval_ok = ev["same_steps"] and ev["max_abs_loss_diff"] <= tol
        if result["compared"] and result["reproduced"] and not eval_ok:
            result["reproduced"] = False
            result["message"] += f"; the eval curve was not reproduced (max |Δeval loss| = {ev['max_abs_loss_diff']:g})"
    compare_samples(original, replay, result)
    return result


def compare_samples(original: dict[str, Any], replay: dict[str, Any], result: dict[str, Any]) -> None:
    """The answers to train.eval_prompts, when the original has some: `samples_match`, and the first that differs.
    On CPU a run is exact, so a different answer means not reproduced; on a GPU it is reported only."""
    sa = (original.get("metrics") or {}).get("samples")
    if not sa:
        return
    key = lambda x: (x["index"], x["step"])  # noqa: E731
    sb = {key(x): x["text"] for x in (replay.get("metrics") or {}).get("samples") or []}
    differ = [x for x in sa if sb.get(key(x)) != x["text"]]
    result["samples_match"] = not differ
    if differ:
        first = differ[0]
        result["samples_first_difference"] = {"step": first["step"], "prompt": first["prompt"],
                                              "original": first["text"], "replay": sb.get(key(first))}
        cpu = ((original.get("spec") or {}).get("hardware") or {}).get("device") == "cpu"
        if cpu and result["compared"] and result["reproduced"]:
            result["reproduced"] = False
            result["message"] += (f"; the answer to {first['prompt']!r} at step {first['step']} differs "
                                  f"({len(differ)} of {len(sa)} samples)")
    else:
        result["message"] += f"; the {len(sa)} sampled answers are the same"


def _steps(rec: dict[str, Any]) -> int:
    return int((rec.get("metrics") or {}).get("steps") or 0)


def _failure(rec: dict[str, Any]) -> tuple[Any, Any]:
    f = rec.get("failure") or {}
    return f.get("cause"), f.get("last_step")


def _outcome(rec: dict[str, Any]) -> str:
    status = rec.get("status")
    if status == "failed":
        f = rec.get("failure") or {}
        what = f.get("cause") or "an unknown cause"
        if f.get("message"):
            what += f" ({str(f['message']).splitlines()[0][:120]})"
        return f"failed at step {f.get('last_step', _steps(rec))} with {what}"
    if status == "cancelled":
        return f"was cancelled after {_steps(rec)} steps"
    return f"{status} after {_steps(rec)} steps"
