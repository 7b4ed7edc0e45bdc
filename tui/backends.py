"""What the screens ask of `runner` that depends on the machine or on optional modules, behind one swappable object."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import api
from runner.errors import Problem
from runner.spec import RunSpec

# The Plan screen's what-if table: tokens per block × these GPU types (plus the spec's own type).
SWEEP_SEQ_LENS = (2048, 8192, 32768)
SWEEP_GPU_TYPES = ("H100-80GB", "H200", "B300")
# ... and beneath it the same run as each method, on the run's own GPU type and block length.
SWEEP_METHODS = ("full", "lora", "qlora")


class EstimatorUnavailable(Exception):
    """A runner module the screens need is not importable in this installation."""


@dataclass
class Backends:
    """Each field, when set, replaces the runner call of the same name (tests pin the answers; see make_app)."""

    estimate_fn: Callable[[RunSpec], dict[str, Any]] | None = None
    sweep_fn: Callable[[RunSpec, list[tuple[str, list[Any]]]], list[dict[str, Any]]] | None = None
    load_arch_fn: Callable[[RunSpec], dict[str, Any]] | None = None
    detect_gpus_fn: Callable[[], list[dict[str, Any]]] | None = None
    gpu_types_list: Sequence[str] | None = None
    preflight_fn: Callable[[RunSpec], list[Problem]] | None = None
    packing_check_fn: Callable[[RunSpec], str | None] | None = None
    disk_fn: Callable[[RunSpec, Path, int | None], dict[str, Any] | None] | None = None

    def estimate(self, spec: RunSpec) -> dict[str, Any]:
        """The estimator's dict for a resolved spec (runner.plan)."""
        if self.estimate_fn is not None:
            return self.estimate_fn(spec)
        return api.estimate(spec).to_dict()

    def disk(self, spec: RunSpec, runs_dir: Path, steps: int | None) -> dict[str, Any] | None:
        """The run's checkpoints and export in bytes against the free space of runs_dir (runner.gate.disk), or
        None where the model's size cannot be read. With a pinned estimate, only a pinned answer."""
        if self.disk_fn is not None or self.estimate_fn is not None:
            return self.disk_fn(spec, runs_dir, steps) if self.disk_fn is not None else None
        plan = api.disk_plan(spec, runs_dir, steps)
        return None if plan is None else plan.to_dict()

    def sweep(self, spec: RunSpec, axes: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
        if self.sweep_fn is not None:
            return self.sweep_fn(spec, axes)
        return api.sweep(spec, axes)

    def load_arch(self, spec: RunSpec) -> dict[str, Any]:
        """The model's architecture summary, where its config came from, and why it is approximate (if it is)."""
        if self.load_arch_fn is not None:
            return self.load_arch_fn(spec)
        return api.arch_summary(spec)

    def preflight(self, spec: RunSpec) -> list[Problem]:
        """What would fail early (data columns, chat template, packing, LoRA targets, GPUs), as runner.gate.preflight
        finds it; EstimatorUnavailable when that module is absent."""
        if self.preflight_fn is not None:
            return self.preflight_fn(spec)
        try:
            return api.preflight_problems(spec)
        except ImportError as e:
            raise EstimatorUnavailable(f"preflight unavailable ({e})") from None

    def packing_check(self, spec: RunSpec) -> str | None:
        """The packing check's verdict line for a spec preflight passed (runner.gate.packcheck; the preflight that
        passed it left it in the cache), or None. With a pinned preflight, only a pinned answer."""
        if self.packing_check_fn is not None or self.preflight_fn is not None:
            return self.packing_check_fn(spec) if self.packing_check_fn is not None else None
        return api.packing_check(spec)

    def detect_gpus(self) -> list[dict[str, Any]]:
        if self.detect_gpus_fn is not None:
            return self.detect_gpus_fn()
        return api.detect_gpus()

    def gpu_types(self) -> list[str]:
        """GPU type names to plan for (runner/facts/gpus.py)."""
        if self.gpu_types_list is not None:
            return list(self.gpu_types_list)
        return api.gpu_types()


def swept_value(row: dict[str, Any], field: str, fallback: Any) -> Any:
    """The value a sweep row was computed for: under the dotted field name, a `sweep`/`values` mapping, or the
    row's own nested spec; `fallback` (the position in the product) when the row does not say."""
    for key in ("sweep", "values", "swept", "overrides"):
        sub = row.get(key)
        if isinstance(sub, dict) and field in sub:
            return sub[field]
    if field in row:
        return row[field]
    node: Any = row.get("spec")
    for part in field.split("."):
        if not isinstance(node, dict) or part not in node:
            return fallback
        node = node[part]
    return node


def sweep_grid(rows: list[dict[str, Any]], axes: list[tuple[str, list[Any]]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Sweep rows keyed by their tuple of swept values (row i is the i-th of the axes' product unless it says)."""
    product = list(itertools.product(*(values for _, values in axes)))
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for i, row in enumerate(rows):
        default = product[i] if i < len(product) else (None,) * len(axes)
        key = tuple(swept_value(row, field, default[j]) for j, (field, _) in enumerate(axes))
        out[key] = row
    return out
