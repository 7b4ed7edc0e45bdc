"""What the estimator's figures were checked against on real runs: outside these model families, GPU types and
numbers of ranks they are extrapolations, and the estimate says so (`approximate`, `approximate_scope`).

Derived from the committed measured rows (benchmarks/memory-calibration-h200.json, native-h200.json and the
`runner bench` results that tests/unit/test_estimate.py checks the estimator against); a test re-derives these sets
from those rows, so a new measured row that widens them fails until they are updated here.
"""

from __future__ import annotations

from runner.plan.choices import Plan

MEASURED_MODEL_TYPES = frozenset({"gpt_oss", "llama", "qwen3", "qwen3_5"})
MEASURED_GPUS = frozenset({"H200"})
MEASURED_WORLD_SIZES = frozenset({1})


def outside_measured(plan: Plan) -> str:
    """Why a GPU plan is outside the measured rows ("" when inside; CPU plans are approximate anyway)."""
    if plan.device != "cuda":
        return ""
    out = []
    if plan.arch.model_type not in MEASURED_MODEL_TYPES:
        out.append(f"model family {plan.arch.model_type}")
    name = plan.gpu.name if plan.gpu else "?"
    if name not in MEASURED_GPUS:
        out.append(f"GPU {name}")
    if plan.world not in MEASURED_WORLD_SIZES:
        out.append(f"{plan.world} ranks")
    if not out:
        return ""
    return (f"not measured: {', '.join(out)} (measured: {', '.join(sorted(MEASURED_MODEL_TYPES))} on "
            f"{', '.join(sorted(MEASURED_GPUS))}, {', '.join(map(str, sorted(MEASURED_WORLD_SIZES)))} rank(s))")
