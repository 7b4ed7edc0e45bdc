"""Extension points are registry rows (engines, job targets, dataset formats): no code outside a registry compares
the names of its rows, and what the spec and the CLI accept is exactly what the registries hold."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.data.formats import COLUMN_KEYS, FORMATS, TARGET_ROLES, TRAIN_ON
from runner.engines import ENGINES
from runner.errors import SpecError, UserError
from runner.facts.targets import TARGETS, target_for
from runner.spec import RunSpec, validate

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Registry:
    word: str
    """What a variable holding one of the names is called (`engine`, `spec.engine`, `o.target`, `det.format`)."""
    names: tuple[str, ...]
    home: str
    """The module that holds the rows: the one place their names are compared."""
    common: tuple[str, ...] = ()
    """Names that are ordinary words elsewhere too (a column called `messages`, a field kind `text`): caught only
    where they are compared with a variable of the registry's word."""

    def comparison(self) -> re.Pattern[str]:
        names = "|".join(self.names)
        own = "|".join(n for n in self.names if n not in self.common) or "(?!)"
        w = self.word
        # `spec.engine == "trl"`, `target != "slurm"`, `det.format in ("text", ...)`: a variable of the word against
        # a literal holding a name; `"trl" == e`, `x != "engine=native"`, `if x in ("sharegpt", ...)`: a name's
        # literal compared, whatever the variable.
        return re.compile(rf"""{w}\w*\W*\s*(==|!=|\bin\b|\bnot in\b)\s*[(\[{{]?[^#]*?["']({w}=)?({names})["']"""
                          rf"""|["']({w}=)?({own})["']\s*(==|!=)"""
                          rf"""|(==|!=)\s*["']({w}=)?({own})["']"""
                          rf"""|\b(if|and|or)\b[^#]*\bin\s*[(\[{{]\s*["']({own})["']""")


REGISTRIES = (
    Registry("engine", tuple(ENGINES), "runner/engines.py"),
    Registry("target", tuple(TARGETS), "runner/facts/targets.py"),
    Registry("format", tuple(FORMATS), "runner/data/formats.py", common=tuple(set(FORMATS) & set(COLUMN_KEYS))),
)
BY_WORD = {r.word: r for r in REGISTRIES}


def comparisons(registry: Registry, text: str) -> list[str]:
    pattern = registry.comparison()
    return [line.strip() for line in text.splitlines() if pattern.search(line)]


@pytest.mark.parametrize("registry", REGISTRIES, ids=lambda r: r.word)
def test_no_name_comparison_outside_the_registry(registry):
    found = []
    for path in sorted([*(REPO / "runner").rglob("*.py"), *(REPO / "tui").rglob("*.py")]):
        if path == REPO / registry.home:
            continue
        found += [f"{path.relative_to(REPO)}: {line}" for line in comparisons(registry, path.read_text())]
    assert not found, f"compare fields of the {registry.word} rows ({registry.home}), not their names:\n" + \
        "\n".join(found)


@pytest.mark.parametrize("word, line", [
    ("engine", 'if spec.engine == "trl":'), ("engine", "if engine != 'native' or x:"), ("engine", 'if "trl" == e:'),
    ("engine", 'bad = [e for e in engines if e not in ("native", "trl")]'),
    ("engine", 'if combo[0] != "engine=native":'), ("engine", 'ok = x and engine in ["trl"]'),
    ("target", 'if target == "slurm":'), ("target", "if o.target != 'kubeflow':"),
    ("target", 'if target in ("kubeflow", "skypilot") and not volume:'),
    ("target", "out = f\"{x}.{'sh' if name == 'slurm' else 'yaml'}\""),
    ("format", 'what = "x" if detected.format not in ("text", "prompt_completion") else "y"'),
    ("format", '"chat": found.format != "text" and found.variant != "standard"'),
    ("format", 'if det.format in ("messages", "sharegpt"):'), ("format", 'if kind == "alpaca":'),
])
def test_the_check_catches_a_comparison(word, line):
    assert comparisons(BY_WORD[word], line) == [line]


@pytest.mark.parametrize("word, line", [
    ("format", 'if messages_field and messages_field != "messages":'), ("format", 'if kind == "text":'),
    ("format", 'if ds.get("format") not in (None, "auto"):'), ("target", 'if t.target_modules == "all-linear":'),
    ("engine", 'if engine_for(spec.engine).fixed_loss:'),
])
def test_the_check_leaves_other_comparisons_alone(word, line):
    assert comparisons(BY_WORD[word], line) == []


def _schema_field(section: str, name: str) -> dict:
    schema = RunSpec.model_json_schema()
    ref = schema["properties"][section]
    ref = ref.get("$ref") or ref["allOf"][0]["$ref"]
    return schema["$defs"][ref.rsplit("/", 1)[1]]["properties"][name]


def test_the_spec_takes_exactly_the_registrys_formats():
    assert _schema_field("dataset", "format")["enum"] == ["auto", *FORMATS]
    assert set(_schema_field("dataset", "columns")["propertyNames"]["enum"]) == set(COLUMN_KEYS)
    assert _schema_field("dataset", "roles")["additionalProperties"]["enum"] == list(TARGET_ROLES)
    assert _schema_field("dataset", "train_on")["enum"] == list(TRAIN_ON)
    for name in ("auto", *FORMATS):
        assert validate({"dataset": {"format": name}}).dataset.format == name
    with pytest.raises(SpecError, match="dataset.format"):
        validate({"dataset": {"format": "csv"}})


def test_the_spec_takes_exactly_the_registrys_engines():
    assert RunSpec.model_json_schema()["properties"]["engine"]["enum"] == list(ENGINES)


def test_every_target_row_has_a_builder_in_the_launcher():
    for target in TARGETS.values():
        assert target_for(target.name) is target
        module, func = target.builder.split(":")
        assert module.startswith("runner.launch.") and callable(getattr(importlib.import_module(module), func))
        assert target.suffix in (".sh", ".yaml")
        assert bool(target.volume) != target.shared_filesystem  # the nodes share a folder one way or the other
    with pytest.raises(ValueError, match="job target must be one of slurm, skypilot, kubeflow"):
        target_for("lsf")


def test_runner_job_takes_exactly_the_registrys_targets():
    from runner.launch.jobs import check_job

    spec = validate({"hardware": {"nproc_per_node": 8}})
    with pytest.raises(UserError, match=f"--to expects one of {', '.join(TARGETS)}, got 'lsf'"):
        check_job(spec, "lsf", "img", "vol", "24:00:00", 300)
    for name in TARGETS:
        check_job(spec, name, "img", "vol", "24:00:00", 300)
