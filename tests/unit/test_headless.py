"""HeadlessDisplay: plain log lines for a synthetic run, and a rich Live render on a (fake) terminal."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from runner.cli.headless import HeadlessDisplay, format_duration
from runner.events.monitor import RunView
from tests.unit.events_fixtures import T0, end, error, node_sample, start, step


def plain_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=40), buf  # narrow: plain lines must not be wrapped


def test_format_duration() -> None:
    assert format_duration(41.4) == "0:00:41"
    assert format_duration(3 * 3600 + 62) == "3:01:02"
    assert format_duration(None) == "?"


def test_plain_lines_for_a_synthetic_run(tmp_path: Path) -> None:
    view = RunView(tmp_path, clock=lambda: T0)
    console, buf = plain_console()
    display = HeadlessDisplay(view, console)
    assert display.plain  # a StringIO is not a terminal
    for r in range(2):
        view.apply(f"rank{r}", start(r, world_size=2, max_steps=4))
    display.update()
    assert buf.getvalue() == ""  # nothing logged yet
    for s in range(1, 5):
        for r in range(2):
            view.apply(f"rank{r}", step(r, s, loss=4.0 / s, tokens=1000, step_s=0.5, t=T0 + s, mem_gib=0.4))
        display.update()
        display.update()  # no new step: no new line
    for r in range(2):
        view.apply(f"rank{r}", end(r, 4))
    display.close()
    assert buf.getvalue().splitlines() == [
        "step 1/4  loss 4.000  lr 1.0e-03  tok/s 4,000  mem 0.4 GiB  eta 0:00:02",
        "step 2/4  loss 2.000  lr 1.0e-03  tok/s 4,000  mem 0.4 GiB  eta 0:00:02",
        "step 3/4  loss 1.333  lr 1.0e-03  tok/s 4,000  mem 0.4 GiB  eta 0:00:01",
        "step 4/4  loss 1.000  lr 1.0e-03  tok/s 4,000  mem 0.4 GiB  eta 0:00:00",
        "run done at step 4/4",
    ]
    assert "\x1b" not in buf.getvalue()


def test_plain_failure_lines(tmp_path: Path) -> None:
    view = RunView(tmp_path, clock=lambda: T0)
    console, buf = plain_console()
    display = HeadlessDisplay(view, console, plain=True)
    for r in (1, 2):  # lowest rank leads even without rank 0
        view.apply(f"rank{r}", start(r, world_size=2, max_steps=None))
        view.apply(f"rank{r}", step(r, 7, loss=float("nan")))
    display.update()
    view.apply("rank2", error(2, 7, t=T0 + 9, cause="NCCL timeout"))
    view.apply("rank1", error(1, 7, t=T0 + 8, cause="CUDA out of memory"))
    display.update()
    display.update()
    display.close()
    assert buf.getvalue().splitlines() == [
        "step 7  loss nan  lr 1.0e-03  tok/s 4,000  mem 1.0 GiB",
        "rank 1 failed at step 7: CUDA out of memory",
        "rank 2 failed at step 7: NCCL timeout",
        "run failed (first: rank 1) at step 7",
    ]


def test_plain_forced_on_a_terminal_has_no_ansi(tmp_path: Path) -> None:
    view = RunView(tmp_path, clock=lambda: T0)
    buf = io.StringIO()
    display = HeadlessDisplay(view, Console(file=buf, force_terminal=True, width=100), plain=True)
    view.apply("rank0", step(0, 1))
    display.update()
    display.close()
    assert buf.getvalue().startswith("step 1  loss 2.000") and "\x1b" not in buf.getvalue()


def test_tty_mode_renders(tmp_path: Path) -> None:
    view = RunView(tmp_path, straggler_steps=2, stall_s=30.0, clock=lambda: T0 + 100)
    buf = io.StringIO()
    display = HeadlessDisplay(view, Console(file=buf, force_terminal=True, width=100))
    assert not display.plain
    display.update()  # empty run
    for r in range(3):
        view.apply(f"rank{r}", start(r, world_size=3, max_steps=200))
    for s in range(1, 11):
        view.apply("rank0", step(0, s, t=T0 + 95))
        view.apply("rank1", step(1, s, t=T0 + 50))  # stalled
        if s <= 5:
            view.apply("rank2", step(2, s, t=T0 + 95))  # straggler
    view.apply("node0", node_sample(t=T0 + 99, ranks=[0, 1]))
    display.update()
    view.apply("rank2", error(2, 6, t=T0 + 99, cause="CUDA out of memory"))
    display.update()
    display.close()
    out = buf.getvalue()
    for text in ("step 5/200", "rank", "tok/s", "straggler", "stall", "failed", "util %", "40.5/79.6", "0,1"):
        assert text in out, text


def test_tty_mode_caps_rank_rows(tmp_path: Path) -> None:
    view = RunView(tmp_path, clock=lambda: T0)
    buf = io.StringIO()
    display = HeadlessDisplay(view, Console(file=buf, force_terminal=True, width=100, height=60))
    for r in range(64):
        view.apply(f"rank{r}", start(r, world_size=64))
        view.apply(f"rank{r}", step(r, 1))
    view.apply("rank63", error(63, 1, t=T0))
    display.update()
    display.close()
    out = buf.getvalue()
    assert "showing 16 of 64 ranks" in out and "failed" in out


def test_plain_lines_keep_every_step_when_the_view_falls_behind(tmp_path: Path) -> None:
    """Piped to a log (`make demo`), a slow view that finds several new steps at one update prints them all."""
    view = RunView(tmp_path, clock=lambda: T0)
    console, buf = plain_console()
    display = HeadlessDisplay(view, console)
    for r in range(2):
        view.apply(f"rank{r}", start(r, world_size=2, max_steps=6))
    for s in range(1, 6):  # five steps between two updates
        for r in range(2):
            view.apply(f"rank{r}", step(r, s, loss=4.0 / s, tokens=1000, step_s=0.5, t=T0 + s, mem_gib=0.4))
    display.update()
    display.lost = True  # the supervisor died: the ranks stopped as if cancelled, but the run failed
    for r in range(2):
        view.apply(f"rank{r}", end(r, 5))
    display.close()
    lines = buf.getvalue().splitlines()
    assert [ln.split()[1] for ln in lines[:5]] == ["1/6", "2/6", "3/6", "4/6", "5/6"]
    assert lines[1] == "step 2/6  loss 2.000  lr 1.0e-03  mem 0.4 GiB"
    assert lines[4].startswith("step 5/6  loss 0.800  lr 1.0e-03  tok/s 4,000")
    assert lines[5:] == ["run failed at step 5: supervisor lost"]


def test_the_resume_line_says_why_there_is_no_checkpoint() -> None:
    from runner.cli.follow import say_resumable

    def said(rec: dict) -> str:
        console, buf = plain_console()
        console.width = 400
        say_resumable(console, rec)
        return buf.getvalue().strip()

    none = {"resumable": False, "checkpoint_step": None, "resume": None}
    # SIGTERM before step 1: a graceful stop writes a checkpoint only once a step was taken.
    early = said({"cancel": {"cause": "stopped", "signal": "SIGTERM", **none}, "metrics": {"steps": 0}})
    assert early == "stopped by SIGTERM; no checkpoint, so it cannot be resumed: it stopped before its first step; " \
                    "start it again"
    ctrl_c = said({"cancel": {"cause": "cancelled", "signal": "SIGINT", **none}, "metrics": {"steps": 5},
                   "spec": {"train": {"checkpoint_every": 0}}})
    assert ctrl_c.endswith("(train.checkpoint_every is 0; a stop by SIGTERM, `runner attach <id> --stop`, writes one)")
    # A lost supervisor: the record's `lost` says whether the ranks' stop left a checkpoint.
    lost = said({"lost": {"resumable": True, "checkpoint_step": 48, "resume": "runner run --resume runs/x"},
                 "metrics": {"steps": 48}})
    assert lost == "supervisor lost; checkpoint at step 48: resume with `runner run --resume runs/x`"
