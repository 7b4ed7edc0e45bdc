"""RunView: smoothing, throughput, ETA, stragglers, stalls, failures, duplicates, node samples."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from runner.events.monitor import RunView
from tests.unit.events_fixtures import T0, end, error, node_sample, start, step, write_events


def make_view(tmp_path: Path, **kwargs) -> RunView:
    return RunView(tmp_path, clock=lambda: T0, **kwargs)


def test_smoothed_loss_is_bias_corrected_ema(tmp_path: Path) -> None:
    view = make_view(tmp_path, loss_alpha=0.5)
    view.apply("rank0", step(0, 1, loss=4.0))
    assert view.ranks[0].loss_smooth == pytest.approx(4.0)  # first value, not dragged towards 0
    view.apply("rank0", step(0, 2, loss=2.0))
    # ema = 0.5*2 + 0.25*4 = 2.0 over weight 0.75
    assert view.ranks[0].loss_smooth == pytest.approx(2.0 / 0.75)
    assert view.ranks[0].loss == 2.0


def test_default_alpha_on_constant_then_nan(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    for s in range(1, 6):
        view.apply("rank0", step(0, s, loss=3.0))
    view.apply("rank0", step(0, 6, loss=float("nan")))
    rs = view.ranks[0]
    assert rs.loss_smooth == pytest.approx(3.0)  # NaN left out of the smoothing
    assert math.isnan(rs.loss)  # but shown as the latest loss
    assert [s for s, _ in rs.losses] == [1, 2, 3, 4, 5, 6]


def test_tokens_per_s_is_ratio_of_sums_and_summed_over_ranks(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    view.apply("rank0", step(0, 1, tokens=1000, step_s=0.5))
    view.apply("rank0", step(0, 2, tokens=1000, step_s=1.5))
    view.apply("rank1", step(1, 1, tokens=3000, step_s=1.0))
    assert view.ranks[0].tokens_per_s == pytest.approx(2000 / 2.0)
    assert view.ranks[1].tokens_per_s == pytest.approx(3000.0)
    assert view.tokens_per_s == pytest.approx(4000.0)
    assert view.ranks[0].tokens_total == 2000


def test_eta_from_remaining_steps_and_slowest_rank_pace(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    assert view.eta_s is None
    for r in range(2):
        view.apply(f"rank{r}", start(r, world_size=2, max_steps=100))
    for s in range(1, 11):
        view.apply("rank0", step(0, s, t=T0 + s * 0.5))
        view.apply("rank1", step(1, s, t=T0 + s * 1.0))  # rank 1 paces the run
    assert view.global_step == 10
    assert view.eta_s == pytest.approx(90 * 1.0)


def test_eta_unknown_without_max_steps_and_zero_when_reached(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    view.apply("rank0", start(0, world_size=1, max_steps=None))
    view.apply("rank0", step(0, 1))
    assert view.max_steps is None and view.eta_s is None
    view2 = make_view(tmp_path)
    view2.apply("rank0", start(0, world_size=1, max_steps=2))
    view2.apply("rank0", step(0, 1, step_s=0.25))
    assert view2.eta_s == pytest.approx(0.25)  # one step known: mean step_s
    view2.apply("rank0", step(0, 2))
    assert view2.eta_s == 0.0


def test_stragglers(tmp_path: Path) -> None:
    view = make_view(tmp_path, straggler_steps=5)
    for s in range(1, 21):
        view.apply("rank0", step(0, s))
    for s in range(1, 11):
        view.apply("rank1", step(1, s))
    for s in range(1, 16):
        view.apply("rank2", step(2, s))
    assert view.stragglers() == [1]  # 10 behind; rank 2 is exactly 5 behind
    assert view.global_step == 10


def test_stall_uses_injected_clock(tmp_path: Path) -> None:
    now = [T0]
    view = RunView(tmp_path, stall_s=60.0, clock=lambda: now[0])
    view.apply("rank0", start(0, t=T0))
    view.apply("rank1", start(1, t=T0))
    view.apply("rank0", step(0, 1, t=T0 + 10))
    view.apply("rank1", step(1, 1, t=T0 + 10))
    now[0] = T0 + 69
    assert view.stalled() == []
    view.apply("rank0", {"event": "heartbeat", "t": T0 + 65, "rank": 0})  # unknown event: still a sign of life
    now[0] = T0 + 71
    assert view.stalled() == [1]
    assert view.event_age_s(1) == pytest.approx(61.0)
    view.apply("rank1", end(1, 1, t=T0 + 72))
    now[0] = T0 + 500
    assert view.stalled() == [0]  # ended ranks do not stall


def test_starting_rank_is_not_stalled(tmp_path: Path) -> None:
    view = RunView(tmp_path, stall_s=60.0, clock=lambda: T0 + 1000)
    view.apply("rank0", start(0, t=T0))
    assert view.ranks[0].status == "starting"
    assert view.stalled() == []


def test_failed_rank_is_the_earliest_error(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    for r in range(3):
        view.apply(f"rank{r}", start(r, world_size=3))
        view.apply(f"rank{r}", step(r, 1))
    assert view.failed_rank() is None and not view.finished
    view.apply("rank0", error(0, 2, t=T0 + 105, cause="NCCL timeout"))
    view.apply("rank2", error(2, 2, t=T0 + 103, cause="CUDA out of memory", message="tried to allocate 2 GiB"))
    view.apply("rank2", error(2, 2, t=T0 + 110, cause="later consequence"))
    assert view.failed_rank() == 2
    rs = view.ranks[2]
    assert (rs.status, rs.error_cause, rs.error_message, rs.error_step) == (
        "failed", "CUDA out of memory", "tried to allocate 2 GiB", 2,
    )
    assert view.finished
    view.apply("rank2", end(2, 2, reason="done"))
    assert view.ranks[2].status == "failed"  # terminal status is not overwritten


def test_finished_when_all_ranks_ended(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    view.apply("rank0", start(0, world_size=2))
    view.apply("rank0", end(0, 5))
    assert view.world_size == 2 and not view.finished  # rank 1 not heard of yet
    view.apply("rank1", end(1, 5, reason="cancelled"))
    assert view.finished
    assert (view.ranks[0].status, view.ranks[1].status) == ("done", "cancelled")


def test_duplicates_ignored(tmp_path: Path) -> None:
    records = [("rank0", start(0)), *[("rank0", step(0, s, loss=5.0 / s, step_s=0.1 * s)) for s in range(1, 30)]]
    once, twice = make_view(tmp_path), make_view(tmp_path)
    for source, rec in records:
        once.apply(source, rec)
    for source, rec in records + records:
        twice.apply(source, rec)
    assert twice.apply(*records[3]) is False  # the same line again: no change
    a, b = once.ranks[0], twice.ranks[0]
    assert a.losses == b.losses and len(b.losses) == 29
    assert (a.loss_smooth, a.tokens_per_s, a.tokens_total, a.step) == (
        b.loss_smooth, b.tokens_per_s, b.tokens_total, b.step,
    )
    assert once.eta_s == twice.eta_s


def test_out_of_order_step_is_kept_sorted(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    for s in (1, 3, 2):
        view.apply("rank0", step(0, s, loss=float(s)))
    rs = view.ranks[0]
    assert rs.losses == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert rs.step == 3 and rs.loss == 3.0


def test_unknown_and_malformed_records_are_tolerated(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    view.apply("rank0", {**start(0), "new_key": {"nested": 1}})
    view.apply("rank0", {"event": "checkpoint", "t": T0 + 1, "rank": 0, "path": "x"})
    view.apply("rank0", {"t": T0 + 2, "rank": 0, "step": "seven", "loss": "x"})
    view.apply("rank0", {"t": T0 + 3, "rank": 0, "step": 1, "loss": None, "tokens": None, "step_s": None})
    view.apply("rank0", {"event": "end"})
    view.apply("weird", {"step": 1})
    view.apply("node0", {"event": "something"})
    view.apply("node0", {"t": T0, "gpus": "n/a", "rank_rss_gib": [1, 2]})
    rs = view.ranks[0]
    assert rs.step == 1 and rs.loss is None and rs.tokens_per_s is None and rs.status == "done"
    assert view.nodes[0].rank_rss_gib == {} and view.gpus == {}


def test_rank_taken_from_source_when_record_lacks_it(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    rec = step(0, 1)
    del rec["rank"]
    view.apply("rank3", rec)
    assert list(view.ranks) == [3]


def test_node_samples(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    assert view.apply("node0", node_sample(t=T0, util_pct=50.0)) is True
    assert view.apply("node0", node_sample(t=T0, util_pct=99.0)) is False  # duplicate sample
    assert view.apply("node0", node_sample(t=T0 + 2, util_pct=None, ranks=[0, 1])) is True
    g = view.gpus[(0, 0)]
    assert (g.util_pct, g.mem_used_gib, g.power_w, g.ranks) == (None, 40.5, None, [0, 1])
    assert g.name == "NVIDIA H100 80GB HBM3"
    n = view.nodes[0]
    assert (n.cpu_pct, n.ram_total_gib, n.rank_rss_gib, n.host) == (12.5, 1000.0, {0: 3.25}, "node0")
    view.apply("node0", {**node_sample(t=T0 + 4), "gpus": []})
    assert view.gpus == {}  # a GPU missing from the latest sample is dropped, not left stale


def test_poll_reads_files(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    assert view.poll() is False  # no events dir yet
    write_events(tmp_path, "rank0", [start(0, world_size=1, max_steps=3), step(0, 1)])
    write_events(tmp_path, "node0", [node_sample()])
    assert view.poll() is True
    assert view.poll() is False
    assert view.ranks[0].status == "running" and view.ranks[0].pid == 1000 and view.ranks[0].host == "node0"
    write_events(tmp_path, "rank0", [step(0, 2), step(0, 3), end(0, 3)])
    assert view.poll() is True
    assert view.finished and view.global_step == 3 and view.max_steps == 3
