"""train.optimizer_precision and model.dtype resolved together, and the rules between them."""

from __future__ import annotations

from typing import Any

from runner.errors import Problem
from runner.engines import engine_for


BF16_PRECISIONS = ("bf16_stochastic", "bf16")


def weights_dtype(spec: Any, device: str) -> str:
    """model.dtype resolved: as set, else what train.optimizer_precision needs, else bf16 on GPU and fp32 on CPU
    (CPU runs are exact and reproducible)."""
    if spec.model.dtype != "auto":
        return spec.model.dtype
    if not engine_for(spec.engine).fixed_optimizer_precision and spec.train.optimizer_precision != "auto":
        return "bfloat16" if spec.train.optimizer_precision in BF16_PRECISIONS else "float32"
    return "bfloat16" if device == "cuda" else "float32"


def optimizer_precision(engine: str, requested: str, dtype: str) -> str:
    """train.optimizer_precision resolved for the weights' dtype: never plain bf16 unless asked for."""
    fixed = engine_for(engine).fixed_optimizer_precision
    if fixed:
        return fixed  # e.g. TRL's trainable weights are made fp32 and computed in bf16 under autocast
    if requested != "auto":
        return requested
    return "bf16_stochastic" if dtype == "bfloat16" else "fp32_master"


def precision_problems(spec: Any) -> list[Problem]:
    """train.optimizer_precision against model.dtype and the engine."""
    want = spec.train.optimizer_precision
    if want == "auto":
        return []
    engine = engine_for(spec.engine)
    fixed = engine.fixed_optimizer_precision
    if fixed and want != fixed:
        return [Problem("train.optimizer_precision", f"{engine.lacks['train.optimizer_precision']}, got {want}",
                        "use train.optimizer_precision=auto (or engine=native)")]
    if fixed:
        # The engine keeps its trainable weights in the precision it fixes whatever model.dtype loads the base in
        # (TRL: fp32 trainable weights under bf16 autocast), so a resolved TRL spec on bf16 weights is consistent.
        return []
    dtype = spec.model.dtype
    if dtype == "bfloat16" and want == "fp32_master":
        return [Problem("train.optimizer_precision", "fp32_master needs fp32 weights, got model.dtype=bfloat16",
                        "set model.dtype=auto or float32, or train.optimizer_precision=bf16_stochastic")]
    if dtype == "float32" and want in BF16_PRECISIONS:
        return [Problem("train.optimizer_precision", f"{want} needs bf16 weights, got model.dtype=float32",
                        "set model.dtype=auto or bfloat16, or train.optimizer_precision=fp32_master")]
    return []
