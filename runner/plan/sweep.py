"""Sweeps: the estimate for every combination of a few spec fields' values (`runner estimate --sweep`)."""

from __future__ import annotations

import itertools
from typing import Any

from runner.errors import Problem, UserError
from runner.plan.whatif import estimate
from runner.spec import RunSpec, apply_override, load_spec


def parse_sweep(arg: str) -> tuple[str, list[Any]]:
    """`train.seq_len=8192,32768` → ('train.seq_len', [8192, 32768]); bad syntax or fields are UserErrors."""
    if "=" not in arg:
        raise UserError("bad --sweep", [Problem("--sweep", f"'{arg}' has no '='",
                                                "write it as field=v1,v2, e.g. train.seq_len=8192,32768")])
    key, raw = arg.split("=", 1)
    key = key.strip()
    values = [v.strip() for v in raw.split(",") if v.strip()]
    if not key:
        raise UserError("bad --sweep", [Problem("--sweep", f"'{arg}' names no field", "write it as field=v1,v2")])
    if not values:
        raise UserError("bad --sweep", [Problem(key, f"--sweep {arg} has no values", f"write it as {key}=v1,v2")])
    apply_override({}, f"{key}={values[0]}")  # unknown fields raise SpecError naming the field
    return key, values


def sweep(spec: RunSpec, sweeps: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
    """The estimate for every combination of the swept values; each row carries the values it used."""
    base = spec.to_dict()
    rows: list[dict[str, Any]] = []
    keys = [k for k, _ in sweeps]
    for combo in itertools.product(*(vals for _, vals in sweeps)):
        overrides = [f"{k}={v}" for k, v in zip(keys, combo)]
        row_spec = load_spec(base, overrides)
        est = estimate(row_spec).to_dict()
        values = {}
        for k in keys:
            node: Any = row_spec.to_dict()
            for part in k.split("."):
                node = node[part]
            values[k] = node
        rows.append({**values, "swept": values, **est})
    return rows
