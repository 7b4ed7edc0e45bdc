"""Sample events (the model's answers to train.eval_prompts): typed lines, the latest per prompt in the live view
and the record, and replay's comparison (exact on CPU, reported only on a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.events.lines import SampleEvent, EventWriter, latest_samples, read_events
from runner.events.monitor import RunView
from runner.record.records import sample_metrics
from runner.record.replay import compare_samples
from runner.spec import load_spec


def _write(path: Path, rows: list[tuple[int, int, str]]) -> list:
    w = EventWriter(path, rank=0)
    for step, index, text in rows:
        w.sample(step=step, index=index, prompt=f"prompt {index}", text=text)
    w.close()
    return read_events(path)


def test_the_latest_line_of_a_prompts_step_counts_in_the_record_and_the_live_view(tmp_path):
    # a resumed run samples step 4 again: its second line is the one kept
    lines = _write(tmp_path / "run" / "events" / "rank0.jsonl",
                   [(2, 0, "a"), (2, 1, "b"), (4, 0, "old"), (4, 1, "d"), (4, 0, "c")])
    assert all(type(e) is SampleEvent for e in lines)
    assert [(e.index, e.step, e.text) for e in latest_samples(lines)] == [(0, 2, "a"), (0, 4, "c"), (1, 2, "b"),
                                                                          (1, 4, "d")]
    assert sample_metrics(lines)["samples"][1] == {"step": 4, "index": 0, "prompt": "prompt 0", "text": "c"}
    assert sample_metrics([]) == {}
    view = RunView(tmp_path / "run")
    view.poll()
    assert {i: (e.step, e.text) for i, e in view.samples.items()} == {0: (4, "c"), 1: (4, "d")}


def _rec(device: str, texts: list[str]) -> dict:
    return {"spec": {"hardware": {"device": device}},
            "metrics": {"samples": [{"step": 4, "index": i, "prompt": f"p{i}", "text": t} for i, t in enumerate(texts)]}}


@pytest.mark.parametrize("device, reproduced", [("cpu", False), ("cuda", True)])
def test_replay_holds_cpu_samples_to_the_same_text(device, reproduced):
    result = {"compared": True, "reproduced": True, "message": "reproduced"}
    compare_samples(_rec(device, ["x", "y"]), _rec(device, ["x", "z"]), result)
    assert result["samples_match"] is False and result["reproduced"] is reproduced
    assert result["samples_first_difference"] == {"step": 4, "prompt": "p1", "original": "y", "replay": "z"}
    same = {"compared": True, "reproduced": True, "message": "reproduced"}
    compare_samples(_rec(device, ["x", "y"]), _rec(device, ["x", "y"]), same)
    assert same["samples_match"] is True and same["message"].endswith("the 2 sampled answers are the same")


def test_eval_prompts_from_a_file_and_their_cadence(tmp_path):
    from runner.train.samples import eval_prompts

    f = tmp_path / "prompts.txt"
    f.write_text("Name a fruit.\n\n  Count to three.  \n")
    assert eval_prompts(load_spec("tiny-cpu", [f"train.eval_prompts={f}"])) == ["Name a fruit.", "Count to three."]
    # prompts make eval_every meaningful without an eval set
    load_spec("tiny-cpu", ["train.eval_every=5", "train.eval_prompts=[Hi]"])


def test_a_missing_prompts_file_is_refused_before_launch(tmp_path, capsys):
    from runner.cli.main import main as runner_main

    code = runner_main(["run", "tiny-cpu", "--set", f"train.eval_prompts={tmp_path / 'nope.txt'}",
                        "--runs-dir", str(tmp_path / "runs"), "--records-dir", str(tmp_path / "records")])
    err = capsys.readouterr().err
    assert code == 2 and "train.eval_prompts" in err and "no such file" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
