"""`runner calibrate`: every record is a calibration point; estimate vs measured peak memory over a records folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from runner.record.records import list_records


def calibration_rows(records_dir: Path) -> list[dict[str, Any]]:
    """One row per finished GPU record that holds both an estimate and a measured peak."""
    rows = []
    for rec in list_records(records_dir):
        est = rec.get("estimate") or {}
        per_rank = ((rec.get("metrics") or {}).get("per_rank") or {}).values()
        peaks = [r.get("peak_mem") or {} for r in per_rank]
        alloc = max((p["allocated"] for p in peaks if "allocated" in p), default=None)
        reserved = max((p["reserved"] for p in peaks if "reserved" in p), default=None)
        if not est or alloc is None:
            continue
        spec = rec["spec"]
        row = {"id": rec["id"], "model": spec["model"]["id"], "engine": spec["engine"],
               "method": spec["method"]["kind"], "seq_len": spec["train"]["seq_len"],
               "checkpointing": spec["train"]["activation_checkpointing"],
               "est_allocated_gib": est.get("per_gpu_allocated_gib"), "allocated_gib": alloc,
               "est_reserved_gib": _est_reserved(est), "reserved_gib": reserved}
        row["error_allocated"] = _rel(row["est_allocated_gib"], alloc)
        row["error_reserved"] = _rel(row["est_reserved_gib"], reserved)
        rows.append(row)
    return rows


def _est_reserved(est: dict[str, Any]) -> float | None:
    # per_gpu_reserved_gib is what nvidia-smi shows (reserved + CUDA context + NCCL); torch's reserved peak
    # excludes the context.
    total = est.get("per_gpu_reserved_gib", est.get("per_gpu_gib"))
    if total is None:
        return None
    return round(total - (est.get("breakdown") or {}).get("cuda_context_nccl", 0.0), 2)


def _rel(est: float | None, measured: float | None) -> float | None:
    if est is None or not measured:
        return None
    return round((est - measured) / measured, 4)


def print_calibration(rows: list[dict[str, Any]], console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    if not rows:
        console.print("no GPU records with both an estimate and a measured peak")
        return
    table = Table(show_edge=False)
    for col in ("id", "model", "engine", "method", "seq_len", "ckpt", "est alloc", "alloc", "err", "est res", "res",
                "err"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["id"], r["model"], r["engine"], r["method"], str(r["seq_len"]),
                      "on" if r["checkpointing"] else "off", _g(r["est_allocated_gib"]), _g(r["allocated_gib"]),
                      _pct(r["error_allocated"]), _g(r["est_reserved_gib"]), _g(r["reserved_gib"]),
                      _pct(r["error_reserved"]))
    console.print(table)
    errs = [abs(r["error_allocated"]) for r in rows if r["error_allocated"] is not None]
    if errs:
        console.print(f"{len(rows)} runs; allocated-peak error: max {max(errs):.1%}, mean {sum(errs) / len(errs):.1%}")


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"
