"""The record's schema version and the migrations that bring an older record to it, one version at a time.

A record is locked as written (`lock` is the sha256 of its stored content), so a migration never rewrites the file:
`records.load` migrates what it read, in memory; `records.verify` checks the stored bytes' lock first, then that
they migrate. A record saved again after a migration (a resumed run's) is written, and locked, in the new schema.

Versions:
1. the first: spec, pins, launch, estimate, metrics, failure.
2. adds `decisions`: what the engine decided at run time (attention path and kernel, loss implementation, FSDP
   wrapping, precision: rank 0's train_begin event), which replay pins.
3. `decisions` is the run's whole decisions file (runner.decide.Decisions, written once before launch and obeyed by
   every rank), which replay gives its ranks whole. A schema-2 record keeps the part its ranks reported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PREFIX = "sft-tui.record/"
VERSION = 3
SCHEMA = f"{PREFIX}{VERSION}"


def version_of(schema: Any) -> int | None:
    """The version number of a `schema` field ("sft-tui.record/2" → 2); None for anything else."""
    if not isinstance(schema, str) or not schema.startswith(PREFIX):
        return None
    number = schema[len(PREFIX):]
    return int(number) if number.isdigit() and int(number) > 0 else None


def schema1_decisions(rec: dict[str, Any]) -> dict[str, Any]:
    """What a schema-1 record says the engine decided: only whether the model was wrapped in FSDP2, from rank 0's
    end event (metrics.per_rank.0.fsdp_sharded); a record older than that field and than train.fsdp_one_rank ran
    wrapped. The rest (attention, loss, precision) it does not say: a replay decides those by today's rules."""
    per_rank = (rec.get("metrics") or {}).get("per_rank") or {}
    sharded = (per_rank.get("0") or {}).get("fsdp_sharded")
    if sharded is not None:
        return {"fsdp_sharded": bool(sharded)}
    if "fsdp_one_rank" not in ((rec.get("spec") or {}).get("train") or {}):
        return {"fsdp_sharded": True}
    return {}


def migrate_1_to_2(rec: dict[str, Any]) -> dict[str, Any]:
    return {**rec, "schema": f"{PREFIX}2", "decisions": schema1_decisions(rec)}


def migrate_2_to_3(rec: dict[str, Any]) -> dict[str, Any]:
    """Nothing to move: a schema-2 record's `decisions` are what its ranks reported, which replay pins field by
    field (runner.record.replay.pinned_decisions); only a schema-3 record's are whole."""
    return {**rec, "schema": f"{PREFIX}3"}


MIGRATIONS: list[Callable[[dict[str, Any]], dict[str, Any]]] = [migrate_1_to_2, migrate_2_to_3]
"""MIGRATIONS[v - 1] takes a record of version v to v + 1; the last one ends at VERSION."""
assert len(MIGRATIONS) == VERSION - 1


def migrate(rec: dict[str, Any]) -> dict[str, Any]:
    """The record in the current schema (a new dict; `rec` is left as read). Its version must be known
    (`version_of` between 1 and VERSION): `records.load` says so before."""
    version = version_of(rec.get("schema"))
    assert version is not None and version <= VERSION, rec.get("schema")
    first = rec.get("schema")
    for step in MIGRATIONS[version - 1:]:
        rec = step(rec)
    if first != rec.get("schema"):
        rec["migrated_from"] = first
    return rec
