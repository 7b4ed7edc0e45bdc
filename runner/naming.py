"""Names: recipe names and the spec files they name, the shipped assets' `embedded:` paths, a model's or dataset's id
that follows its local path, a run's name and description that follow what the run is, and the revision names the
hub accepts."""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from runner.errors import Problem, SpecError

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
EMBEDDED_PREFIX = "embedded:"


def resolve_embedded(path: str) -> Path:
    """`embedded:model` → the shipped assets; any other path is returned expanded."""
    if path.startswith(EMBEDDED_PREFIX):
        return RECIPES_DIR / "embedded" / path[len(EMBEDDED_PREFIX):]
    return Path(path).expanduser()


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def find_spec_file(spec: str) -> Path:
    """A recipe name (recipes/<name>.yaml) or a path to a YAML/JSON file."""
    path = Path(spec)
    if path.suffix in {".yaml", ".yml", ".json"} or os.sep in spec:
        if not path.is_file():
            raise SpecError(f"spec file not found: {spec}", [Problem("SPEC", f"no file at {path}", "check the path")])
        return path
    candidate = RECIPES_DIR / f"{spec}.yaml"
    if candidate.is_file():
        return candidate
    names = recipe_names()
    close = difflib.get_close_matches(spec, names, n=1)
    fix = f"did you mean '{close[0]}'?" if close else f"known recipes: {', '.join(names) or 'none'}"
    raise SpecError(f"unknown recipe '{spec}'", [Problem("SPEC", f"no recipe named '{spec}'", fix)])


_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    """yaml.safe_load, through libyaml where PyYAML has it: a recipe parses in about a tenth of the time (the planner,
    the wizard and the tests read recipes hundreds of times). Text libyaml refuses goes through the Python parser,
    which raises the error shown: its message names the character at fault (a tab)."""
    try:
        return yaml.load(text, Loader=_FAST_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError:
        return yaml.safe_load(text)


def read_spec_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"cannot read {path}: {e.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else load_yaml(text)
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        where = ""
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        elif isinstance(e, json.JSONDecodeError):
            where = f" at line {e.lineno}, column {e.colno}"
        problem = str(getattr(e, 'problem', None) or e.msg)
        # YAML refuses a tab where it expects indentation; "fix the syntax" would not say so.
        fix = "indent with spaces, not tabs" if "'\\t'" in problem else "fix the syntax"
        raise SpecError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}{where}",
                        [Problem("SPEC", problem, fix)]) from None
    if data is None or data == {}:
        # An empty file is a mistake (a failed save, the wrong path), not a request for the defaults.
        raise SpecError(f"{path} is empty", [Problem("SPEC", "the file holds no fields",
                                                    "write the fields to change (see `runner fields`), or give a "
                                                    "recipe name such as tiny-cpu")])
    if not isinstance(data, dict):
        raise SpecError(f"{path} must hold a mapping of fields, got {type(data).__name__}")
    return data


def path_name(path: str) -> str:
    """`local/<name>` for a local path: the folder's name, or the file's without its data suffixes (.jsonl.gz)."""
    p = Path(str(path).rstrip("/"))
    name = p.name
    for suffix in (".gz", ".jsonl", ".json", ".parquet", ".csv"):
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return f"local/{name or 'data'}"


def follow_paths(data: dict[str, Any], sections: set[str], embedded_prefix: str,
                 default_ids: dict[str, Any]) -> list[str]:
    """Rename `model` / `dataset` after its new path when the path changed and the id did not: the id is the
    name `runner list`, the records and the pins show, and the recipe's (sft-tui/tiny-chat) would make every run
    on other data look the same. A path set to the recipe's own embedded asset keeps its id. One note each."""
    notes = []
    for section in sorted(sections):
        body = data.get(section)
        path = body.get("path") if isinstance(body, dict) else None
        if not path or str(path).startswith(embedded_prefix):
            continue
        old = body.get("id", default_ids.get(section))
        body["id"] = path_name(str(path))
        notes.append(f"{section}.id is now {body['id']} (named after {section}.path; it was {old}); "
                     f"set {section}.id to name it otherwise")
    return notes


def overridden_sections(overrides: list[str] | tuple[str, ...]) -> set[str]:
    """The sections (model, dataset) whose path a list of `--set` assignments changes without their id."""
    keys = {a.split("=", 1)[0].strip() for a in overrides}
    changed = {k.split(".")[0] for k in keys if k in ("model.path", "dataset.path")}
    return changed - {k.split(".")[0] for k in keys if k in ("model.id", "dataset.id")}


# What a recipe's name and description speak of: while a run still has these values as the recipe gave them, the
# recipe's name and description are the run's; once one changes they would describe another run.
RUN_IDENTITY = ("model.id", "model.path", "dataset.id", "dataset.path", "dataset.train_on", "method.kind")


def _get(data: dict[str, Any], dotted: str, defaults: dict[str, Any]) -> Any:
    for source in (data, defaults):
        node: Any = source
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return node
    return None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.rsplit("/", 1)[-1].lower()).strip("-")


def run_name(data: dict[str, Any], defaults: dict[str, Any] | None = None) -> tuple[str, str]:
    """The name and description a run gets from what it is: `<model>-<method>-<data>[-tool-calls]` and
    "<method> fine-tune of <model> on <data>[, loss on replies and tool calls]"."""
    defaults = defaults or {}
    model = str(_get(data, "model.id", defaults) or path_name(str(_get(data, "model.path", defaults) or "model")))
    dataset = str(_get(data, "dataset.id", defaults) or path_name(str(_get(data, "dataset.path", defaults) or "data")))
    kind = str(_get(data, "method.kind", defaults) or "full")
    tools = _get(data, "dataset.train_on", defaults) == "assistant+tool_calls"
    name = "-".join(p for p in (_slug(model) or "model", kind, _slug(dataset) or "data") if p)
    description = f"{kind} fine-tune of {model} on {dataset}"
    return (name + "-tool-calls", description + ", loss on replies and tool calls") if tools else (name, description)


def follow_run(data: dict[str, Any], origin: dict[str, Any], defaults: dict[str, Any] | None = None,
               typed: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Name and describe `data` after the run it is (run_name) when it no longer matches the recipe it came from
    (`origin`) in model, data, train_on or method (RUN_IDENTITY). A name or description in `typed` (the user's own,
    from `--set` or the wizard) is kept, and so is one that differs from the recipe's: someone chose it for this
    run. One note when it renames."""
    defaults = defaults or {}
    if all(_get(data, k, defaults) == _get(origin, k, defaults) for k in RUN_IDENTITY):
        return []
    derived = dict(zip(("name", "description"), run_name(data, defaults)))
    renamed = []
    for field, value in derived.items():
        current = _get(data, field, defaults)
        if field in typed or current != _get(origin, field, defaults) or current == value:
            continue
        data[field] = value
        renamed.append(field)
    if not renamed:
        return []
    verb = "follow" if len(renamed) > 1 else "follows"
    return [f"{' and '.join(renamed)} now {verb} the run: {', '.join(repr(data[f]) for f in renamed)} (the recipe's "
            f"{_get(origin, 'name', defaults)!r} is another model, data or method); set {' or '.join(renamed)} "
            "to choose your own"]


def overridden_fields(overrides: list[str] | tuple[str, ...]) -> set[str]:
    """The dotted fields a list of `--set` assignments sets."""
    return {a.split("=", 1)[0].strip() for a in overrides}


# A git ref name as the hub accepts it: no whitespace, no '..', none of ~^:?*[\ and not ending in '/' or '.lock'.
_REVISION = re.compile(r"^(?!.*\.\.)(?!.*/$)(?!.*\.lock$)[^\s~^:?*\[\\]{1,255}$")


def valid_revision(rev: str) -> bool:
    return bool(_REVISION.match(rev))


def revision_problems(revisions: dict[str, str | None]) -> list[Any]:
    """A problem for each revision (field → value) that is set and is no ref name the hub would take."""
    from runner.errors import Problem

    return [Problem(name, f"not a branch, tag or commit SHA, got {rev!r}",
                    "use e.g. main, v1.0 or a 40-character commit SHA (no spaces, '..' or '~^:?*[\\')")
            for name, rev in revisions.items() if rev is not None and not valid_revision(rev)]
