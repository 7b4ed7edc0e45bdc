"""The README's demo numbers come from this run: `runner run tiny-cpu` as `make demo` runs it (150 steps), whose
record's first and last global loss must be the ones the README prints, so they cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runner.record import records
from tests.conftest import dir_args, last_json, run_cli

pytestmark = pytest.mark.dist

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_demo_loss_is_what_the_demo_gives(dirs, capsys):
    code, out, _ = run_cli(["run", "tiny-cpu", "--json", "--plain", *dir_args(dirs)], capsys)
    assert code == 0, out
    m = records.load(Path(last_json(out)["record"]))["metrics"]
    text = README.read_text()
    # The summary line in the demo's transcript, and the headline that rounds it.
    [(steps, first, last)] = re.findall(r"^succeeded: (\d+) steps, loss ([\d.]+) → ([\d.]+), ", text, re.M)
    assert (int(steps), first, last) == (m["steps"], f"{m['first_loss']:.4f}", f"{m['final_loss']:.4f}"), m
    assert f"**loss {m['first_loss']:.2f} → {m['final_loss']:.2f} in {m['steps']} steps**" in text
