"""What the screens ask of `runner` that depends on the machine or on optional modules, behind one swappable object."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from runner.errors import Problem
from runner.spec import RunSpec

# GPU types offered for planning when runner.catalog does not list its own (names as the spec takes them).
DEFAULT_GPU_TYPES = ("H100-80GB", "H200", "B200", "B300", "A100-80GB")
# The Plan screen's what-if table: tokens per block × these GPU types (plus the spec's own type).
SWEEP_SEQ_LENS = (2048, 8192, 32768)
SWEEP_GPU_TYPES = ("H100-80GB", "H200", "B300")


class EstimatorUnavailable(Exception):
    """runner.estimate (or runner.catalog) is not importable in this installation."""


def _as_dict(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    return dict(vars(obj))


@dataclass
class Backends:
    """Each field, when set, replaces the runner call of the same name (tests pin the answers; see make_app)."""

    estimate_fn: Callable[[RunSpec], dict[str, Any]] | None = None
    sweep_fn: Callable[[RunSpec, list[tuple[str, list[Any]]]], list[dict[str, Any]]] | None = None
    load_arch_fn: Callable[[RunSpec], dict[str, Any]] | None = None
    detect_gpus_fn: Callable[[], list[dict[str, Any]]] | None = None
    gpu_types_list: Sequence[str] | None = None
    preflight_fn: Callable[[RunSpec], list[Problem]] | None = None

    def estimate(self, spec: RunSpec) -> dict[str, Any]:
        """The estimator's dict for a resolved spec; EstimatorUnavailable when runner.estimate is absent."""
        if self.estimate_fn is not None:
            return self.estimate_fn(spec)
        try:
            from runner.estimate import estimate
        except ImportError as e:
            raise EstimatorUnavailable(f"estimator unavailable ({e})") from None
        return _as_dict(estimate(spec))

    def sweep(self, spec: RunSpec, axes: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
        if self.sweep_fn is not None:
            return self.sweep_fn(spec, axes)
        try:
            from runner.estimate import sweep
        except ImportError as e:
            raise EstimatorUnavailable(f"estimator unavailable ({e})") from None
        return [_as_dict(row) for row in sweep(spec, axes)]

    def load_arch(self, spec: RunSpec) -> dict[str, Any]:
        """The model's architecture summary; falls back to the estimate's `arch` when runner.catalog is absent."""
        if self.load_arch_fn is not None:
            return self.load_arch_fn(spec)
        try:
            from runner.catalog import load_arch
        except ImportError:
            arch = self.estimate(spec).get("arch")
            if not arch:
                raise EstimatorUnavailable("architecture unavailable (no runner.catalog, no arch in the estimate)")
            return dict(arch)
        loaded = load_arch(spec)
        arch = getattr(loaded, "arch", loaded)
        out = dict(arch.summary()) if hasattr(arch, "summary") else _as_dict(arch)
        if getattr(loaded, "source", None):
            out["source"] = loaded.source
        reasons = getattr(arch, "approximate_reasons", None)
        if reasons:
            out["approximate"] = "; ".join(reasons)
        return out

    def preflight(self, spec: RunSpec) -> list[Problem]:
        """What would fail early (data columns, chat template, packing, LoRA targets, GPUs), as runner.preflight
        finds it; EstimatorUnavailable when that module is absent."""
        if self.preflight_fn is not None:
            return self.preflight_fn(spec)
        try:
            from runner.preflight import preflight_problems
        except ImportError as e:
            raise EstimatorUnavailable(f"preflight unavailable ({e})") from None
        from runner.hub import hub_problems

        return hub_problems(spec) + preflight_problems(spec)

    def detect_gpus(self) -> list[dict[str, Any]]:
        if self.detect_gpus_fn is not None:
            return self.detect_gpus_fn()
        from runner.sampler import detect_gpus

        return detect_gpus()

    def gpu_types(self) -> list[str]:
        """GPU type names to plan for: the catalog's when it has a list, else a built-in few."""
        if self.gpu_types_list is not None:
            return list(self.gpu_types_list)
        try:
            from runner import catalog  # type: ignore[attr-defined]
        except ImportError:
            return list(DEFAULT_GPU_TYPES)
        for name in ("gpu_names", "gpu_types"):
            fn = getattr(catalog, name, None)
            if callable(fn):
                try:
                    return [str(n) for n in fn()]
                except Exception:  # noqa: BLE001 - a catalog problem must not break the wizard
                    break
        for name in ("GPUS", "GPU_TYPES"):
            table = getattr(catalog, name, None)
            if isinstance(table, dict) and table:
                return [str(n) for n in table]
        return list(DEFAULT_GPU_TYPES)


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
