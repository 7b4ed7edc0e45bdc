"""runner/ works without the TUI: importing it or running its CLI never loads textual; no runner file imports it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORE = ("runner", "runner.api", "runner.cli.main", "runner.cli.session", "runner.events.monitor", "runner.cli.headless",
        "runner.record.records", "runner.spec")

PROBE = f"""
import contextlib, io, sys
import {", ".join(CORE)}
import runner.cli.main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = runner.cli.main.main(["--help"])
    except SystemExit as e:  # argparse exits after printing help
        code = e.code
assert code == 0, code
assert "usage: runner" in out.getvalue(), out.getvalue()[:200]
loaded = sorted(m for m in sys.modules if m == "textual" or m.startswith("textual."))
print("TEXTUAL:" + ",".join(loaded))
"""


def test_core_and_cli_help_do_not_load_textual() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("TEXTUAL:"))
    assert line == "TEXTUAL:", f"textual was imported by the core: {line[8:]}"


def test_python_m_runner_help_does_not_load_textual() -> None:
    """`python -m runner --help` as a user runs it, with an import hook that fails on textual."""
    guard = ("import sys\n"
             "class _NoTextual:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name == 'textual' or name.startswith('textual.'):\n"
             "            raise ImportError('runner imported textual: ' + name)\n"
             "sys.meta_path.insert(0, _NoTextual())\n"
             "import runpy\n"
             "sys.argv = ['runner', '--help']\n"
             "runpy.run_module('runner', run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", guard], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: runner" in proc.stdout


def test_no_runner_file_imports_textual() -> None:
    pattern = re.compile(r"^\s*(import\s+textual\b|from\s+textual\b)", re.M)
    offenders = [str(p.relative_to(REPO)) for p in sorted((REPO / "runner").rglob("*.py"))
                 if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_the_check_would_catch_an_offender(tmp_path: Path) -> None:
    """The pattern above is not vacuous: it finds both spellings, indented too, and not in comments about it."""
    pattern = re.compile(r"^\s*(import\s+textual\b|from\s+textual\b)", re.M)
    assert pattern.search("import os\nfrom textual.app import App\n")
    assert pattern.search("def f():\n    import textual\n")
    assert not pattern.search("# never import textual here\nimport textualize_not\n")
