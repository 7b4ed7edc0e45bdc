"""Short, unit-carrying text for numbers, durations and paths as the screens show them."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any


def num(value: Any, spec: str = ".4f", missing: str = "-") -> str:
    """A number in `spec`, `missing` when absent, NaN/inf spelled out."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return missing
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec)


def gib(value: Any, digits: int = 1) -> str:
    return num(value, f".{digits}f")


def duration(seconds: Any) -> str:
    """H:MM:SS, or "?" when unknown."""
    if seconds is None or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def count(n: Any) -> str:
    """1234567 → 1.23M: parameter and token counts."""
    if n is None or isinstance(n, bool) or not isinstance(n, (int, float)):
        return "-"
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:g}"


def show_path(path: str | os.PathLike[str] | None) -> str:
    """Relative to the working directory when under it (what a user types), else absolute with ~ for home."""
    if path is None:
        return "-"
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        pass
    home = str(Path.home())
    text = str(p)
    return "~" + text[len(home):] if home != "/" and text.startswith(home + os.sep) else text


def theme_color(app: Any, name: str, fallback: str = "default") -> str:
    """A design-token colour as a hex string, for Rich renderables (DataTable cells) that cannot take `$name`."""
    try:
        return app.get_css_variables().get(name, fallback)
    except Exception:  # noqa: BLE001 - before the app is running there is no theme yet
        return fallback


# -- the memory estimate, one figure and one label on every screen (Plan, dashboard, summary, record) ---------------


def estimate_device(est: dict[str, Any] | None) -> str:
    est = est or {}
    return str(est.get("device") or ("cpu" if est.get("gpu") == "cpu" else "cuda"))


def per_unit(device: str) -> str:
    return "rank" if device == "cpu" else "GPU"


def memory_estimate(est: dict[str, Any] | None, device: str | None = None) -> str:
    """"0.32 GiB needed per rank": the estimate's `per_gpu_gib`, the figure its verdict is about (PyTorch's peak
    allocated plus fragmentation and the process's own memory), "-" when there is none. `device` (the run's) wins
    over what the estimate says."""
    est = est or {}
    return f"{gib(est.get('per_gpu_gib'), 2)} GiB needed per {per_unit(device or estimate_device(est))}"


# The estimator's breakdown keys as a CPU run's legend names them: a CPU rank has no CUDA context or NCCL.
CPU_PART_NAMES = {"cuda_context_nccl": "process"}


def breakdown_parts(est: dict[str, Any] | None) -> dict[str, Any]:
    est = est or {}
    parts = dict(est.get("breakdown") or {})
    if estimate_device(est) == "cpu":
        parts = {CPU_PART_NAMES.get(k, k): v for k, v in parts.items()}
    return parts
