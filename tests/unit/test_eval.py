"""Evaluation: which rows are held out, eval loss and accuracy of a batch, early stopping, the record's eval
metrics, replay and diff of eval curves, and the spec's checks."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from runner.record import records
from runner.record.compare import diff_records
from runner.events.lines import parse_event
from runner.errors import SpecError
from runner.record.replay import compare
from runner.spec import load_spec
from runner.train.attention import packing_kwargs
from runner.train.data import BlockStream, DataSource, collate, make_block
from runner.train.evaluation import Evaluator, eval_sums, is_heldout
from runner.train.loss import full_loss_sum
from tests.unit.test_packing import _answers, _qwen3, tokenizer  # noqa: F401 (fixture)

ROWS = 300


def _source(tmp_path, **kw) -> DataSource:
    data = tmp_path / "rows.jsonl"
    if not data.exists():
        data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"question {i}"},
                                                           {"role": "assistant", "content": f"answer {i}"}]})
                                  for i in range(ROWS)) + "\n")
    return DataSource(path=data, dataset_id=None, revision=None, split="train", messages_field="messages",
                      seq_len=64, pad_id=0, packing=True, seed=0, epochs=1, **kw)


def _answers_of(source, tok, world):
    return sorted(a for r in range(world) for a in _answers(list(BlockStream(source, tok, r, world)), tok))


def test_held_out_rows_do_not_depend_on_world_size_and_are_never_trained_on(tmp_path, tokenizer):  # noqa: F811
    held = {w: _answers_of(_source(tmp_path, eval_fraction=0.1, heldout=True), tokenizer, w) for w in (1, 2, 3)}
    assert held[1] == held[2] == held[3]
    assert 10 <= len(held[1]) <= 55  # about 10% of 300 rows
    trained = _answers_of(_source(tmp_path, eval_fraction=0.1), tokenizer, 2)
    assert not set(trained) & set(held[1])
    assert sorted(trained + held[1]) == sorted(str(i) for i in range(ROWS))


def test_held_out_choice_follows_the_seed_and_content():
    row = {"messages": [{"role": "user", "content": "hi"}]}
    picks = [is_heldout(row, seed, 0.5) for seed in range(64)]
    assert 0 < sum(picks) < 64  # the seed moves it
    assert is_heldout(row, 7, 0.5) == is_heldout(json.loads(json.dumps(row)), 7, 0.5)
    assert not is_heldout(row, 7, 0.0)


def test_eval_sums_are_the_loss_and_argmax_accuracy_of_the_block():
    model = _qwen3("sdpa")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 128, (90,), generator=g).tolist()
    mask = [False] * 20 + [True] * 30 + [False] * 10 + [True] * 30
    batch = collate([make_block(ids, mask, [0, 50], 128, 0)])
    loss, right, targets = eval_sums(model, batch).tolist()
    with torch.no_grad():
        assert loss == pytest.approx(float(full_loss_sum(model, batch)), rel=1e-6)
        logits = model(input_ids=batch["input_ids"], use_cache=False, **packing_kwargs(batch)).logits[0, :-1]
    labels = batch["labels"][0, 1:]
    keep = labels != -100
    assert targets == int(keep.sum()) == 60
    assert right == int((logits.argmax(-1)[keep] == labels[keep]).sum())


class _Events:
    def __init__(self):
        self.lines = []

    def eval(self, **fields):
        self.lines.append({"event": "eval", **fields})


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_early_stopping_after_patience_evals_without_improvement(one_rank_group):
    spec = load_spec("tiny-cpu", ["dataset.eval_fraction=0.05", "train.eval_every=10",
                                  "train.early_stop_patience=2"])
    ev = Evaluator(spec, "cpu", batches=[{}], own_blocks=1)
    losses = iter([3.0, 2.0, 2.5, 1.9, 2.1, 2.2])
    events = _Events()
    stops = [ev.run(torch.nn.Linear(1, 1), step, events,
                    sums_fn=lambda b: torch.tensor([next(losses) * 100, 50.0, 100.0], dtype=torch.float64))["stop"]
             for step in (10, 20, 30, 40, 50, 60)]
    assert stops == [False, False, False, False, False, True]
    last = events.lines[-1]
    assert last["event"] == "eval" and last["best_step"] == 40 and last["best_loss"] == pytest.approx(1.9)
    assert last["accuracy"] == 0.5 and last["target_tokens"] == 100
    assert ev.due(20) and not ev.due(25)


def test_resume_restores_the_early_stopping_count():
    spec = load_spec("tiny-cpu", ["dataset.eval_fraction=0.05", "train.eval_every=10",
                                  "train.early_stop_patience=2"])
    ev = Evaluator(spec, "cpu", batches=[], own_blocks=0)
    past = [{"event": "eval", "step": 10, "loss": 2.0}, {"event": "eval", "step": 20, "loss": 2.2},
            {"event": "eval", "step": 30, "loss": 1.0}, {"step": 20, "loss": 9.0}]
    ev.restore([parse_event(e) for e in past], 20)  # resumed from the checkpoint of step 20: the eval at 30 is not part of it
    assert ev.best == (10, 2.0) and ev.stale == 1 and [s for s, _ in ev.history] == [10, 20]


def test_eval_metrics_in_the_record(tmp_path):
    ev = tmp_path / "events"
    ev.mkdir()
    rows = [{"event": "start", "t": 0, "rank": 0}]
    for s in (1, 2, 3, 4):
        rows.append({"t": s, "rank": 0, "step": s, "loss": 5.0 - s, "tokens": 10})
    rows += [{"event": "eval", "t": 2, "rank": 0, "step": 2, "loss": 2.5, "accuracy": 0.4, "target_tokens": 9},
             {"event": "eval", "t": 4, "rank": 0, "step": 4, "loss": 2.7, "accuracy": 0.38, "target_tokens": 9},
             {"event": "end", "t": 5, "rank": 0, "tokens": 40, "train_s": 4.0, "stopped_early": 4,
              "data": {"blocks": 4, "real_tokens": 240, "packing_efficiency": 0.9375, "split_documents": 0,
                       "examples": 12, "fingerprint": "x"}}]
    (ev / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = records.metrics_from_events(ev, 1, "cpu")
    assert m["eval_curve"] == {"2": 2.5, "4": 2.7} and m["eval_accuracy"] == {"2": 0.4, "4": 0.38}
    assert (m["final_eval_loss"], m["best_eval_loss"], m["best_eval_step"]) == (2.7, 2.5, 2)
    assert m["stopped_early"] == 4
    assert m["packing"] == {"blocks": 4, "examples": 12, "split_documents": 0, "real_tokens": 240,
                            "packing_efficiency": 0.9375}


def _rec(rid, eval_curve):
    return {"id": rid, "status": "succeeded", "spec": {}, "pins": {},
            "metrics": {"steps": 2, "loss_curve": {"0": [[1, 2.0], [2, 1.5]]}, "eval_curve": eval_curve}}


def test_replay_holds_the_eval_curve_to_the_tolerance():
    same = compare(_rec("a", {"2": 1.25}), _rec("b", {"2": 1.25}), 0.0)
    assert same["reproduced"] and same["max_abs_eval_loss_diff"] == 0.0
    moved = compare(_rec("a", {"2": 1.25}), _rec("b", {"2": 1.2500001}), 0.0)
    assert not moved["reproduced"] and moved["eval_first_divergence"]["step"] == 2
    missing = compare(_rec("a", {"2": 1.25, "4": 1.0}), _rec("b", {"2": 1.25}), 0.0)
    assert not missing["reproduced"] and not missing["eval_same_steps"]
    assert compare(_rec("a", None), _rec("b", None), 0.0)["reproduced"]  # no eval: the loss curve decides


def test_diff_shows_eval_curve_steps_that_differ():
    rows = diff_records(_rec("a", {"2": 1.25, "10": 1.0}), _rec("b", {"2": 1.25, "10": 0.9}))
    assert ("metrics.eval_curve.10", 1.0, 0.9) in rows
    assert not any(k == "metrics.eval_curve.2" for k, _, _ in rows)


@pytest.mark.parametrize("sets, field", [
    (["dataset.eval_fraction=0.1", "dataset.eval_split=test"], "dataset.eval_fraction"),
    (["train.eval_every=10"], "train.eval_every"),
    (["dataset.eval_fraction=0.1", "train.early_stop_patience=3"], "train.early_stop_patience"),
    (["dataset.eval_split=train"], "dataset.eval_split"),
    (["dataset.eval_split=test"], "dataset.eval_split"),  # the embedded data is one file: no named splits
    (["dataset.eval_fraction=1.5"], "dataset.eval_fraction"),
    (["train.packing_strategy=first_fit"], "train.packing_strategy"),
])
def test_spec_checks_name_the_field(sets, field):
    with pytest.raises(SpecError) as e:
        load_spec("tiny-cpu", sets)
    assert field in [p.field for p in e.value.problems]


def test_defaults_and_recipes_that_stay_wrapped():
    assert load_spec("tiny-cpu").train.packing_strategy == "bfd"
    for name in ("qwen3.8-27b-full-8xb300", "qwen3-1.7b-full-h200", "qwen3.5-hybrid-reduced-h200",
                 "gpt-oss-reduced-lora-h200"):
        assert load_spec(name).train.packing_strategy == "wrapped", name
    # The bench recipes measure what users get: the default packing on conversations of realistic lengths.
    for name in ("qwen3-1.7b-bench-h200", "qwen3-4b-bench-h200", "llama-3.2-3b-bench-h200"):
        assert load_spec(name).train.packing_strategy == "bfd", name
    ok = load_spec("tiny-cpu", ["dataset.eval_fraction=0.05", "train.eval_every=25", "train.early_stop_patience=2"])
    assert ok.report.to == [] and ok.dataset.eval_split is None
