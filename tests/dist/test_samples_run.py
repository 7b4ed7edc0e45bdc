"""What the TRL engine's model says while it trains, on a real 2-rank run: the sample at the end equals the exported
model's greedy answer. (The native engine's samples, their events and their replay: tests/dist/test_eval_runs.py,
on the launch its eval checks share.)"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from runner.cli.main import main as runner_main
from tests.conftest import last_json

pytestmark = pytest.mark.dist

PROMPTS = ["Name the capital city of Canada.", "Count the letters in garden."]


def _cli(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = runner_main(args)
    return code, out.getvalue()


def test_the_trl_engine_samples_too(tmp_path: Path):
    from runner.train.generate import load_for_try

    dirs = ["--runs-dir", str(tmp_path / "runs"), "--records-dir", str(tmp_path / "records")]
    code, out = _cli(["run", "tiny-cpu", "--set", "engine=trl", "--set", "train.max_steps=4",
                      "--set", "train.warmup_steps=1", "--set", f"train.eval_prompts={json.dumps(PROMPTS[:1])}",
                      "--set", "output.save=full", "--json", "--plain", *dirs])
    assert code == 0, out
    rec = json.loads(Path(last_json(out)["record"]).read_text())
    assert [(s["step"], s["prompt"]) for s in rec["metrics"]["samples"]] == [(4, PROMPTS[0])]  # at the end
    text = load_for_try(rec).answer([{"role": "user", "content": PROMPTS[0]}], 48).text
    assert rec["metrics"]["samples"][0]["text"] == text
