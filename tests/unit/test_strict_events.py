"""Event lines are strict JSON: no NaN anywhere; a step without targets is null, a divergence still reaches the
display, and the record's final loss is the global one."""

from __future__ import annotations

import json
import math
from pathlib import Path

from runner.events.lines import EventWriter
from runner.events.monitor import RunView
from runner.record.records import metrics_from_events


def _refuse(name: str):
    raise ValueError(f"{name} is not JSON")


def _write(path: Path, rank: int, steps: list[tuple[int, float | None, float | None, int]]) -> None:
    w = EventWriter(path / f"rank{rank}.jsonl", rank)
    w.event("start", world_size=2)
    for step, loss, global_loss, targets in steps:
        w.step(step=step, loss=loss, lr=1e-3, grad_norm=float("inf") if step == 3 else 1.0, tokens=8, step_s=0.1,
               mem_gib=0.5, global_loss=global_loss, target_tokens=targets)
    w.event("end", steps=len(steps), tokens=8 * len(steps), train_s=1.0)
    w.close()


def test_lines_parse_strictly_and_the_record_keeps_the_global_loss(tmp_path: Path):
    # rank 0 has no target at steps 2 and 3 (the middle of a long prompt); step 3 diverges on rank 1
    events = tmp_path / "events"  # a run folder's events, as metrics_from_events reads them
    _write(events, 0, [(1, 2.0, 2.5, 4), (2, None, 1.5, 0), (3, None, float("nan"), 0), (4, None, 1.2, 0)])
    _write(events, 1, [(1, 3.0, 2.5, 4), (2, 1.5, 1.5, 4), (3, float("nan"), float("nan"), 4), (4, 1.2, 1.2, 4)])
    lines = [json.loads(x, parse_constant=_refuse) for r in (0, 1)
             for x in (events / f"rank{r}.jsonl").read_text().splitlines()]
    diverged = [e for e in lines if e.get("step") == 3]
    assert all(e["grad_norm"] is None and e["nonfinite"]["grad_norm"] == "inf" for e in diverged)
    assert [e["nonfinite"].get("loss") for e in diverged] == [None, "nan"]  # no targets is not a divergence
    m = metrics_from_events(events, 2, "cpu")
    assert m["loss_curve"]["0"] == [[1, 2.0], [2, None], [3, None], [4, None]]
    assert m["final_loss"] == m["final_global_loss"] == 1.2 and m["first_loss"] == 2.5


def test_the_monitor_shows_none_for_no_targets_and_nan_for_a_divergence(tmp_path: Path):
    events = tmp_path / "events"
    _write(events, 0, [(1, 2.0, 2.0, 4), (2, None, 1.5, 0)])
    _write(events, 1, [(1, 2.0, 2.0, 4), (2, float("nan"), float("nan"), 4)])
    view = RunView(tmp_path)
    view.poll()
    assert view.ranks[0].loss is None and view.ranks[0].loss_smooth == 2.0
    assert math.isnan(view.ranks[1].loss)
