"""Names: a model's or dataset's id that follows its local path when only the path changed, and the revision names
the hub accepts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


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
