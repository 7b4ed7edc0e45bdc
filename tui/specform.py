"""The wizard's state: a raw spec dict edited field by field, validated whole by runner.spec after each edit."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from runner.api import follow_paths, follow_run, overridden_fields, overridden_sections, save_text
from runner.errors import Problem, SpecError, UserError
from runner.spec import EMBEDDED_PREFIX, RunSpec, apply_override, find_spec_file, read_spec_file, validate

DEFAULT_RECIPE = "tiny-cpu"
# Fields a saved recipe always spells out, even at their default: what the run is, on what.
ALWAYS_SAVED = ("name", "model.id", "model.path", "dataset.id", "dataset.path", "engine", "method.kind",
                "hardware.device")


def defaults() -> dict[str, Any]:
    return RunSpec().to_dict()


def get_path(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[last] = value


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def full_dict(raw: dict[str, Any]) -> dict[str, Any]:
    """Every field present: the validated spec's dict, or (when invalid) the raw values over the defaults, so the
    wizard can show the bad values next to their fields."""
    try:
        return validate(raw).to_dict()
    except SpecError:
        return _merge(defaults(), raw)


def load_recipe_dict(ref: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """A recipe name or file with `--set` overrides applied, as a full dict, not yet validated (the wizard shows the
    problems). Unknown recipe, unreadable file or a malformed `--set` raise SpecError."""
    data = read_spec_file(find_spec_file(str(ref)))
    origin = full_dict(data)
    for assignment in overrides:
        apply_override(data, assignment)
    data = full_dict(data)
    # A new path names the model or data after it, and the run after what it now is, as `runner run --set`
    # does (runner.naming).
    follow_paths(data, overridden_sections(overrides), EMBEDDED_PREFIX, {})
    follow_run(data, origin, {}, overridden_fields(overrides))
    return data


def problems_of(data: dict[str, Any]) -> list[Problem]:
    """Every problem runner.spec finds in the dict (empty when it is a valid RunSpec)."""
    try:
        validate(data)
    except SpecError as e:
        return list(e.problems) or [Problem("", str(e))]
    return []


def field_of(problem_field: str, fields: list[str]) -> str | None:
    """The wizard field a problem belongs to: the longest field path that prefixes it (pydantic appends union tags
    such as `hardware.nproc_per_node.int`)."""
    best = None
    for f in fields:
        if problem_field == f or problem_field.startswith(f + "."):
            if best is None or len(f) > len(best):
                best = f
    return best


def minimal_dict(data: dict[str, Any]) -> dict[str, Any]:
    """The fields that differ from the defaults (plus ALWAYS_SAVED), nested: what a readable recipe file holds."""
    base = defaults()
    out: dict[str, Any] = {}

    def walk(node: dict[str, Any], ref: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and isinstance(ref.get(key), dict):
                walk(value, ref[key], path + ".")
            elif path in ALWAYS_SAVED or _plain(value) != _plain(ref.get(key)):
                set_path(out, path, value)

    walk(data, base, "")
    return out


def _plain(x: Any) -> str:
    return json.dumps(x, sort_keys=True, default=str)


def recipe_yaml(data: dict[str, Any]) -> str:
    spec = validate(data)
    head = f"# {spec.name}: saved by sft-tui; run it with `runner run <this file>` or `sft-tui --recipe <this file>`.\n"
    return head + yaml.safe_dump(minimal_dict(spec.to_dict()), sort_keys=False)


def save_recipe(data: dict[str, Any], path: Path) -> Path:
    """Write the wizard's choices as a recipe YAML that load_spec reads back to the same RunSpec."""
    text = recipe_yaml(data)
    if path.suffix not in {".yaml", ".yml"}:
        raise UserError(f"a recipe file must end in .yaml or .yml, got {path.name}: try {path.with_suffix('.yaml')}")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_text(path, text)  # whole or not at all: a full disk leaves the old recipe
    return path

