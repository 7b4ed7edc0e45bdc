"""Side-by-side views of records: `runner list` and `runner diff` (only what differs)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

# Keys too bulky or too noisy to show in a diff; they are summarised elsewhere.
# The eval curves are summarised by final/best eval loss (and shown step by step by `runner diff` below them).
_SKIP = {"lock", "loss_curve", "eval_curve", "eval_accuracy", "packages", "created", "finished", "run_dir", "id", "argv", "command", "diff_file"}


def summary_row(rec: dict[str, Any]) -> dict[str, Any]:
    spec, m = rec.get("spec") or {}, rec.get("metrics") or {}
    return {
        "id": rec.get("id"),
        "created": rec.get("created"),
        "status": rec.get("status"),
        "model": (spec.get("model") or {}).get("id"),
        "dataset": dataset_name(spec),
        "train_on": (spec.get("dataset") or {}).get("train_on", "assistant"),
        "method": f"{spec.get('engine', '?')}/{(spec.get('method') or {}).get('kind', '?')}",
        "steps": m.get("steps"),
        "final_loss": m.get("final_loss"),
        "final_eval_loss": m.get("final_eval_loss"),
        "tokens_per_s": m.get("tokens_per_s"),
        "replay_of": rec.get("replay_of"),
        "resumes": len(rec.get("resumes") or []),
    }


def origin(row: dict[str, Any]) -> str:
    """How a run came to be, for `runner list`: a replay names the record it re-ran, a resumed run its launches."""
    parts = [f"replay of {row['replay_of']}"] if row.get("replay_of") else []
    if row.get("resumes"):
        parts.append(f"resumed ×{row['resumes']}")
    return ", ".join(parts) or "-"


def resume_sentence(rec: dict[str, Any] | None) -> str | None:
    """Whether a cancelled run (or one whose supervisor was lost) can be resumed, and how: the CLI and the wizard's
    summary say the same. None for a record with neither."""
    rec = rec or {}
    cancel = rec.get("cancel") or rec.get("lost")
    if not cancel:
        return None
    if "cancel" in rec:
        why = f"{cancel.get('cause')}" + (f" by {cancel['signal']}" if cancel.get("signal") else
                                          f" from {cancel['by']}" if cancel.get("by") else "")
    else:
        why = "supervisor lost"
    if cancel.get("resumable"):
        return f"{why}; checkpoint at step {cancel['checkpoint_step']}: resume with `{cancel['resume']}`"
    if cancel.get("signal") in ("SIGTERM", "SIGUSR1") or not (rec.get("metrics") or {}).get("steps"):
        # A graceful stop writes a checkpoint only once a step was taken: before step 1 there is nothing to keep.
        return f"{why}; no checkpoint, so it cannot be resumed: it stopped before its first step; start it again"
    every = ((rec.get("spec") or {}).get("train") or {}).get("checkpoint_every")
    return (f"{why}; no checkpoint, so it cannot be resumed (train.checkpoint_every is {every or 0}; a stop by "
            "SIGTERM, `runner attach <id> --stop`, writes one)")


def dataset_name(spec: dict[str, Any]) -> str | None:
    """The dataset as a user named it: the hub id, else the local path's file or folder name."""
    ds = spec.get("dataset") or {}
    path = ds.get("path")
    if ds.get("id"):
        return str(ds["id"])
    return str(path).rstrip("/").rsplit("/", 1)[-1] if path else None


def print_list(recs: list[dict[str, Any]], console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    if not recs:
        console.print("no records")
        return
    rows = [summary_row(rec) for rec in recs]
    table = Table(show_edge=False)
    # The id is what replay, verify and diff take: never wrapped or cut, whatever the terminal's width.
    table.add_column("id", no_wrap=True, min_width=max(len(str(r["id"])) for r in rows))
    for col in ("created", "status", "origin", "model", "dataset", "method", "steps", "final loss", "tokens/s"):
        table.add_column(col, justify="right" if col in {"steps", "final loss", "tokens/s"} else "left",
                         overflow="fold")
    for r in rows:
        table.add_row(r["id"], (r["created"] or "")[:19], r["status"], origin(r), r["model"],
                      (r["dataset"] or "-") + (" (+tool calls)" if r["train_on"] == "assistant+tool_calls" else ""),
                      r["method"],
                      str(r["steps"] or 0),
                      "-" if r["final_loss"] is None else f"{r['final_loss']:.4f}",
                      "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}")
    console.print(table)


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in _SKIP:
                continue
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = obj
    return out


def diff_records(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) for spec, pins, the engine's decisions, metrics, status and failure,
    differing keys only (records read in the current schema: `records.load` migrates older ones)."""
    rows: list[tuple[str, Any, Any]] = []
    for section in ("status", "spec", "pins", "launch", "decisions", "metrics", "failure", "replay_of"):
        fa, fb = flatten({section: a.get(section)}), flatten({section: b.get(section)})
        for key in sorted(set(fa) | set(fb)):
            if fa.get(key) != fb.get(key):
                rows.append((key, fa.get(key), fb.get(key)))
    ca = (a.get("metrics") or {}).get("eval_curve") or {}
    cb = (b.get("metrics") or {}).get("eval_curve") or {}
    for step in sorted(set(ca) | set(cb), key=int):
        if ca.get(step) != cb.get(step):
            rows.append((f"metrics.eval_curve.{step}", ca.get(step), cb.get(step)))
    pa = (a.get("pins") or {}).get("packages") or {}
    pb = (b.get("pins") or {}).get("packages") or {}
    for name in sorted(set(pa) | set(pb)):
        if pa.get(name) != pb.get(name):
            rows.append((f"pins.packages.{name}", pa.get(name), pb.get(name)))
    return rows


def print_diff(a: dict[str, Any], b: dict[str, Any], rows: list[tuple[str, Any, Any]],
               console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    if not rows:
        console.print(f"{a['id']} and {b['id']}: no differences in spec, pins or metrics")
        return
    table = Table(show_edge=False)
    table.add_column("field", overflow="fold")
    table.add_column(a["id"], overflow="fold")
    table.add_column(b["id"], overflow="fold")
    # A terminal gets long values (loss curves) cut to a glance; a file or a pipe gets every value in full.
    cut = console.is_terminal
    for key, va, vb in rows:
        table.add_row(key, _short(va, cut), _short(vb, cut))
    console.print(table)


def _short(v: Any, cut: bool = True) -> str:
    s = "-" if v is None else str(v)
    return s if not cut or len(s) <= 60 else s[:57] + "…"
