"""The shape of the code: runner/ laid out by stage (a stage imports only the stages its row of MAY_IMPORT lists), no
import cycle, and no module or function in runner/ or tui/ past the size limit."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "runner"
SIZED = (RUNNER, REPO / "tui")
# runner/'s stages (docs/design.md's layout) and the stages each may import besides its own: a table, not a line,
# because the graph is not a chain. The root holds the errors and the helpers every stage uses; the spec sits above
# the facts and data, whose registries (engines, dataset formats) give its fields their allowed values. The rank's
# code (train) imports no stage that plans, gates, launches or records: those stay out of the ranks, and the gate is
# the one that runs the rank's own packer and model before launch. The launcher sits above record (the supervisor
# writes the record) and gate (it keeps the disk reserve the gate checks); api is the faces' door; cli is a face.
_BELOW_TRAIN = frozenset({"root", "facts", "data", "spec", "events", "decide"})
MAY_IMPORT: dict[str, frozenset[str]] = {
    "root": frozenset(),
    "facts": frozenset({"root"}),
    "data": frozenset({"root", "facts"}),
    "spec": frozenset({"root", "facts", "data"}),
    "events": frozenset({"root", "facts", "data", "spec"}),
    "decide": frozenset({"root", "facts", "data", "spec", "events"}),
    "train": _BELOW_TRAIN,
    "plan": frozenset({"root", "facts", "data", "spec", "decide"}),
    "gate": _BELOW_TRAIN | {"train", "plan"},
    "record": _BELOW_TRAIN,
    "launch": _BELOW_TRAIN | {"plan", "gate", "record"},
    "api": _BELOW_TRAIN | {"train", "plan", "gate", "record", "launch"},
    "cli": _BELOW_TRAIN | {"train", "plan", "gate", "record", "launch", "api"},
}
STAGES = tuple(MAY_IMPORT)
ROOT_MODULES_MAX = 10
# What tui/ may import from runner/: the faces' door and the types it speaks in (the spec, its errors, the live view
# model of a run's events). The CLI is the other face, never a library of tui/'s.
TUI_ALLOWED = ("runner.api", "runner.spec", "runner.errors", "runner.events.monitor")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# Nothing is excepted: a module or function that grows past the limit is split, not listed here.
LONG_FUNCTIONS_ALLOWED: set[tuple[str, str]] = set()  # likewise
LONG_MODULES_ALLOWED: set[str] = set()  # likewise


def module_name(path: Path) -> str:
    parts = list(path.relative_to(RUNNER.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(RUNNER.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The runner modules a module imports, at its top or inside a function (both run at some point)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            # `import runner.plan.choices` also runs runner.plan's __init__; the imported module is the target.
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != "runner":
                found.add(name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    graph = {}
    for name, path in mods.items():
        deps = imports_of(path, known) - {name}
        # A package's modules import their package's __init__ on the way in; that edge is Python's, not a design
        # choice, as long as __init__ only re-exports.
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    return graph


def test_no_import_cycle_among_runner_modules():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def stage_of(module: str) -> str:
    parts = module.split(".")
    if parts[1] == "__main__":
        return "cli"  # `python -m runner` is the CLI
    return parts[1] if parts[1] in STAGES else "root"  # `runner.spec` is its own stage


def forbidden_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for every import across stages that MAY_IMPORT does not list."""
    return sorted((m, d) for m, deps in graph.items() for d in deps
                  if m != "runner" and stage_of(d) != stage_of(m) and stage_of(d) not in MAY_IMPORT[stage_of(m)])


def test_every_runner_module_belongs_to_a_stage():
    assert {stage_of(m) for m in modules() if m != "runner"} <= set(STAGES)


def test_the_stage_table_is_a_dag_over_known_stages():
    assert set().union(*MAY_IMPORT.values()) <= set(STAGES)
    assert all(s not in allowed for s, allowed in MAY_IMPORT.items())
    assert cycles({s: set(allowed) for s, allowed in MAY_IMPORT.items()}) == []


def test_no_stage_imports_a_stage_it_may_not():
    assert forbidden_imports(import_graph()) == []


def test_the_stage_check_would_catch_a_forbidden_import():
    graph = {"runner.train.native": {"runner.plan.core"}, "runner.plan.core": {"runner.data.packing"},
             "runner.data.packing": set()}
    assert forbidden_imports(graph) == [("runner.train.native", "runner.plan.core")]


def test_the_stage_check_would_catch_plan_record_or_launch_importing_train():
    graph = {"runner.plan.core": {"runner.train.packing", "runner.facts.flops"},
             "runner.record.weights": {"runner.train.model"}, "runner.launch.process": {"runner.train.lifetime"},
             "runner.gate.packcheck": {"runner.train.model"}, "runner.train.model": {"runner.events.paths"},
             "runner.train.packing": set(), "runner.train.lifetime": set(), "runner.facts.flops": set(),
             "runner.events.paths": set()}
    assert forbidden_imports(graph) == [("runner.launch.process", "runner.train.lifetime"),
                                        ("runner.plan.core", "runner.train.packing"),
                                        ("runner.record.weights", "runner.train.model")]


def test_runner_root_holds_only_a_few_modules():
    root = sorted(p.name for p in RUNNER.glob("*.py")
                  if p.name not in ("__init__.py", "__main__.py") and p.stem not in STAGES)
    assert len(root) <= ROOT_MODULES_MAX, root


def tui_import_graph() -> dict[str, set[str]]:
    known = set(modules())
    return {str(p.relative_to(REPO)): imports_of(p, known) for p in sorted((REPO / "tui").rglob("*.py"))}


def past_the_door(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((f, m) for f, deps in graph.items() for m in deps if m not in TUI_ALLOWED)


def test_tui_imports_only_the_api_and_its_types():
    assert past_the_door(tui_import_graph()) == []


def test_the_door_check_sees_imports_at_the_top_and_inside_functions():
    graph = tui_import_graph()
    assert "runner.api" in graph["tui/app.py"] and "runner.api" in graph["tui/backends.py"]
    assert past_the_door({"tui/x.py": {"runner.api", "runner.cli.main", "runner.gate.disk"}}) == [
        ("tui/x.py", "runner.cli.main"), ("tui/x.py", "runner.gate.disk")]


def _sized_files() -> list[Path]:
    return [p for d in SIZED for p in sorted(d.rglob("*.py"))]


def test_no_module_over_the_size_limit():
    long = {str(p.relative_to(REPO)): n for p in _sized_files()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert set(long) <= LONG_MODULES_ALLOWED, long


def test_no_function_over_the_size_limit():
    long = {}
    for p in _sized_files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[(str(p.relative_to(REPO)), node.name)] = n
    assert set(long) <= LONG_FUNCTIONS_ALLOWED, long


def test_tui_tests_wait_on_conditions_not_fixed_pauses():
    """A fixed `pilot.pause(seconds)` passes a slow machine's check for the wrong reason (the thing it waits for has
    not happened yet): tests wait with tests/tui/conftest.py's wait_for or settle instead."""
    import re

    fixed = [f"{p.relative_to(REPO)}:{i}" for p in sorted((REPO / "tests" / "tui").glob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"pilot\.pause\(\s*[^)\s]", line)]
    assert fixed == []
