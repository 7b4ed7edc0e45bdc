"""What the model says while it trains, on a real 2-rank run: `sample` events from rank 0 at every eval_every steps
and at the end, the record's samples, the last one equal to the exported model's greedy answer, and a replay that
compares them."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from runner.cli.main import main as runner_main
from runner.events.lines import SampleEvent, events_of, read_events
from tests.conftest import last_json

pytestmark = pytest.mark.dist

PROMPTS = ["Name the capital city of Canada.", "Count the letters in garden."]


def _cli(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = runner_main(args)
    return code, out.getvalue()


def test_samples_are_written_recorded_and_replayed(tmp_path: Path):
    from runner.train.generate import load_for_try

    dirs = ["--runs-dir", str(tmp_path / "runs"), "--records-dir", str(tmp_path / "records")]
    code, out = _cli(["run", "tiny-cpu", "--set", "train.max_steps=8", "--set", "train.warmup_steps=1",
                      "--set", "train.eval_every=5", "--set", f"train.eval_prompts={json.dumps(PROMPTS)}",
                      "--set", "output.save=full", "--json", "--plain", *dirs])
    assert code == 0, out
    rec = json.loads(Path(last_json(out)["record"]).read_text())
    run_dir = Path(rec["run_dir"])
    samples = events_of(read_events(run_dir / "events" / "rank0.jsonl"), SampleEvent)
    assert [(e.step, e.index, e.prompt) for e in samples] == [(5, 0, PROMPTS[0]), (5, 1, PROMPTS[1]),
                                                               (8, 0, PROMPTS[0]), (8, 1, PROMPTS[1])]
    assert not events_of(read_events(run_dir / "events" / "rank1.jsonl"), SampleEvent)  # rank 0 writes them
    assert rec["metrics"]["samples"] == [{"step": e.step, "index": e.index, "prompt": e.prompt, "text": e.text}
                                         for e in sorted(samples, key=lambda e: (e.index, e.step))]
    # the last samples are the trained model's own greedy answers (48 tokens at most while training)
    model = load_for_try(rec)
    for e in samples[2:]:
        print(f"step {e.step}: {e.prompt!r} -> {e.text!r}")
        assert model.answer([{"role": "user", "content": e.prompt}], 48).text == e.text
    code, out = _cli(["replay", last_json(out)["record"], "--json", "--plain", *dirs])
    result = last_json(out)
    print(result["message"])
    assert code == 0 and result["reproduced"] is True and result["samples_match"] is True
    assert "4 sampled answers are the same" in result["message"]


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
