"""Event lines: the typed writers produce the contract's JSON, and the readers' helpers read it back."""

from __future__ import annotations

import json
import math

import pytest

from runner.events.lines import (
    END,
    EVAL,
    EVENT_KINDS,
    START,
    TYPES,
    CheckpointEvent,
    EndEvent,
    EventWriter,
    OtherEvent,
    StartEvent,
    StepEvent,
    TrainBeginEvent,
    events_of,
    first_event,
    is_step,
    latest_evals,
    latest_steps,
    parse_event,
    parse_line,
    read_events,
    step_lines,
)
from runner.events.monitor import RunView
from runner.record import records
from tests.unit.events_fixtures import T0, end, start, step, write_events


def test_writers_and_readers_agree(tmp_path):
    path = tmp_path / "rank1.jsonl"
    w = EventWriter(path, rank=1)
    w.start(local_rank=1, node_rank=0)
    w.train_begin(attn="sdpa", fsdp="fsdp2 over 2 ranks")
    w.step(step=1, loss=2.5, lr=1e-3, grad_norm=0.7, tokens=512, step_s=0.1, mem_gib=0.5, doc_len_sq=9)
    w.step(step=2, loss=None, lr=1e-3, grad_norm=0.0, tokens=0, step_s=0.1, mem_gib=0.5)
    w.checkpoint(step=2, path="x")
    w.end(step=2, tokens=512)
    w.close()
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    # The JSON on disk is the contract: lifecycle lines carry "event", step lines do not.
    assert [r.get("event") for r in raw] == [START, "train_begin", None, None, "checkpoint", END]
    assert {"t", "rank", "step", "loss", "lr", "grad_norm", "tokens", "step_s", "mem_gib"} <= set(raw[2])
    lines = read_events(path)
    assert [is_step(e) for e in lines] == [False, False, True, True, False, False]
    assert [type(e) for e in lines] == [StartEvent, TrainBeginEvent, StepEvent, StepEvent, CheckpointEvent, EndEvent]
    steps = step_lines(lines)
    assert [s.step for s in steps] == [1, 2] and steps[0].extra == {"doc_len_sq": 9} and steps[1].loss is None
    assert steps[0].rank == 1 and steps[0].tokens == 512 and steps[0] == StepEvent.from_line(raw[2])
    assert first_event(lines, TrainBeginEvent).attn == "sdpa" and len(events_of(lines, END)) == 1
    assert first_event(lines, "error") is None and set(EVENT_KINDS) >= {r["event"] for r in raw if "event" in r}
    assert lines[0].local_rank == 1 and lines[-1].tokens == 512 and lines[-1]["event"] == END


def test_every_kind_has_a_type_and_a_writer(tmp_path):
    path = tmp_path / "rank0.jsonl"
    w = EventWriter(path, rank=0)
    for kind in EVENT_KINDS:
        getattr(w, kind)(step=3)
    w.close()
    lines = read_events(path)
    assert [e.kind for e in lines] == list(EVENT_KINDS) and EVAL in EVENT_KINDS
    assert [type(e) for e in lines] == [TYPES[k] for k in EVENT_KINDS]
    assert all(type(e) is not OtherEvent for e in lines)


def test_reader_tolerates_unknown_keys_wrong_types_and_a_torn_last_line(tmp_path):
    path = tmp_path / "rank0.jsonl"
    good = [{"t": 1.0, "rank": 0, "step": 1, "loss": None, "nonfinite": {"loss": "nan"}, "tokens": "many",
             "new_key": [1]},
            {"t": 2.0, "rank": 0, "event": "reshard", "why": "newer writer"},
            {"t": 3.0, "rank": 0, "event": "end", "tokens": 7, "peak_mem_gib": {"rss": 0.5}, "fsdp_sharded": "yes"}]
    path.write_text("".join(json.dumps(x) + "\n" for x in good) + "not json\n" + '{"t": 4.0, "rank": 0, "st')
    lines = read_events(path)
    assert len(lines) == 3  # the corrupted line and the torn last one are left out
    step, other, end = lines
    assert step.tokens is None and step.extra["new_key"] == [1] and step.loss is None
    assert math.isnan(step.number("loss")) and step.number("lr") is None
    assert isinstance(other, OtherEvent) and other.kind == "reshard" and other.extra == {"why": "newer writer"}
    assert end.tokens == 7 and end.peak_mem_gib == {"rss": 0.5} and end.fsdp_sharded is None
    assert parse_line("[1, 2]") is None and parse_line("{") is None and parse_event({"t": 1}).kind is None


def _resumed_run(run_dir):
    """Rank 0 of a run that crashed after step 4 and resumed from its checkpoint at step 2: steps 3 and 4 (and the
    eval at step 4) are logged twice, the second time by the resumed run, with other numbers."""
    first = [step(0, s, loss=10.0 - s, tokens=100) for s in (1, 2, 3, 4)]
    resumed = [step(0, s, loss=20.0 - s, tokens=200) for s in (3, 4, 5)]
    evals = [{"event": "eval", "t": T0 + 4, "rank": 0, "step": 4, "loss": 9.0, "accuracy": 0.1},
             {"event": "eval", "t": T0 + 40, "rank": 0, "step": 4, "loss": 8.0, "accuracy": 0.2}]
    write_events(run_dir, "rank0", [start(0, world_size=1), *first, evals[0], end(0, 4), *resumed, evals[1],
                                    end(0, 5)])


def test_a_repeated_step_keeps_its_last_line_everywhere(tmp_path):
    _resumed_run(tmp_path)
    want = [[1, 9.0], [2, 8.0], [3, 17.0], [4, 16.0], [5, 15.0]]
    evs = read_events(tmp_path / "events" / "rank0.jsonl")
    assert [[e.step, e.loss] for e in latest_steps(evs)] == want
    assert [(e.step, e.loss) for e in latest_evals(evs)] == [(4, 8.0)]
    # The record ...
    m = records.metrics_from_events(tmp_path / "events", 1, "cpu")
    assert m["loss_curve"]["0"] == want and m["eval_curve"] == {"4": 8.0} and m["final_loss"] == 15.0
    # ... and the live view read the same lines the same way.
    view = RunView(tmp_path, clock=lambda: T0)
    view.poll()
    rs = view.ranks[0]
    assert [[s, loss] for s, loss in rs.losses] == want and view.evals[4] == (8.0, 0.2)
    assert rs.tokens_total == 100 + 100 + 200 * 3 and rs.step == 5 and rs.loss == 15.0
    # The smoothing is over the kept losses, as if the run had logged them once.
    fresh = RunView(tmp_path / "fresh", clock=lambda: T0)
    for s, loss in want:
        fresh.apply("rank0", step(0, s, loss=loss))
    assert rs.loss_smooth == pytest.approx(fresh.ranks[0].loss_smooth)
    # Negative control: the first lines of steps 3 and 4 are different numbers.
    assert [e.loss for e in step_lines(evs) if e.step in (3, 4)] == [7.0, 6.0, 17.0, 16.0]
