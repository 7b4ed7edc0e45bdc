"""Event lines: the typed writers produce the contract's JSON, and the readers' helpers read it back."""

from __future__ import annotations

import json

from runner.events.lines import (
    END,
    EVENT_KINDS,
    START,
    EventWriter,
    StepEvent,
    events_of,
    first_event,
    is_step,
    read_events,
    step_lines,
)


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
    steps = [StepEvent.from_line(e) for e in step_lines(lines)]
    assert [s.step for s in steps] == [1, 2] and steps[0].extra == {"doc_len_sq": 9} and steps[1].loss is None
    assert steps[0].rank == 1 and steps[0].tokens == 512
    assert first_event(lines, "train_begin")["attn"] == "sdpa" and len(events_of(lines, END)) == 1
    assert first_event(lines, "error") is None and set(EVENT_KINDS) >= {r["event"] for r in raw if "event" in r}
