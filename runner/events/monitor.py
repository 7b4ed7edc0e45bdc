"""View model of a live run, shared by the TUI and headless mode: per-rank, per-GPU and per-node state."""

from __future__ import annotations

import bisect
import math
import os
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.events.lines import (EndEvent, ErrorEvent, EvalEvent, Event, SampleEvent, StartEvent, StepEvent, StepIndex,
                                 parse_event)
from runner.events.paths import RunPaths
from runner.events.tail import DirTail

# Weight of the newest loss in the smoothed loss. 0.1 averages over roughly the last 10 logged steps: enough to
# see the trend through per-batch noise, short enough to show a divergence within a few steps.
DEFAULT_LOSS_ALPHA = 0.1
# Steps (of one rank) used for its throughput and its seconds per step.
RATE_WINDOW_STEPS = 20

_SOURCE = re.compile(r"^(rank|node)(\d+)$")
_TERMINAL = ("done", "failed", "cancelled")


def _num(rec: dict[str, Any], key: str) -> float | None:
    """The record's number at `key`, None when absent or not a number (keys are written by other code). A NaN or
    infinity comes back as such from the `nonfinite` names that strict event lines carry (runner.events.lines)."""
    v = rec.get(key)
    nonfinite = rec.get("nonfinite")
    if v is None and isinstance(nonfinite, dict) and key in nonfinite:
        try:
            return float(nonfinite[key])
        except (TypeError, ValueError):
            return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _int(rec: dict[str, Any], key: str) -> int | None:
    v = rec.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return int(v)


def _str(rec: dict[str, Any], key: str) -> str | None:
    v = rec.get(key)
    return None if v is None else str(v)


@dataclass
class RankState:
    """What one global rank reported: identity (from its start event), latest step metrics, loss history, status."""

    rank: int
    node: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    max_steps: int | None = None
    step: int = 0  # highest step logged
    loss: float | None = None  # of the highest step
    # Bias-corrected EMA of the finite losses, weight `alpha` for the newest (see RunView): on the first step it
    # is that loss, early on it is the mean so far, later the recent trend. NaN/inf losses are kept in `loss`
    # and `losses` but left out of the smoothing so that one bad step does not blank the curve.
    loss_smooth: float | None = None
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, loss), sorted by step, one per step
    lr: float | None = None
    grad_norm: float | None = None
    tokens_total: int = 0
    # sum(tokens) / sum(step_s) over the last RATE_WINDOW_STEPS steps: a ratio of sums, so a short step does
    # not weigh as much as a long one.
    tokens_per_s: float | None = None
    step_s: float | None = None  # of the highest step
    mem_gib: float | None = None
    peak_mem_gib: float | None = None
    last_t: float | None = None  # time of the latest event of any kind: the rank's heartbeat
    status: str = "starting"  # "starting" | "running" | "done" | "failed" | "cancelled"
    error_cause: str | None = None
    error_message: str | None = None
    error_step: int | None = None
    error_t: float | None = None
    # (step, t, tokens, step_s) of recent steps, for the rates above and the ETA.
    recent: deque[tuple[int, float | None, int, float | None]] = field(
        default_factory=lambda: deque(maxlen=RATE_WINDOW_STEPS), repr=False
    )
    _ema: float = field(default=0.0, repr=False)
    _ema_weight: float = field(default=0.0, repr=False)
    steps: StepIndex[StepEvent] = field(default_factory=StepIndex, repr=False)
    """The step lines kept: one per step, the last (`StepIndex`)."""

    def seconds_per_step(self) -> float | None:
        """Recent wall-clock seconds per step: from event times when two steps are known (counts data loading and
        logging, and works whatever the logging interval), else the mean reported step_s."""
        if len(self.recent) >= 2:
            (s0, t0, _, _), (s1, t1, _, _) = self.recent[0], self.recent[-1]
            if t0 is not None and t1 is not None and s1 > s0 and t1 >= t0:
                return (t1 - t0) / (s1 - s0)
        step_s = [s for _, _, _, s in self.recent if s is not None]
        return sum(step_s) / len(step_s) if step_s else None


@dataclass
class GpuState:
    """Latest sample of one GPU of one node (None: NVML could not say)."""

    node: int
    index: int
    host: str | None = None
    name: str | None = None
    uuid: str | None = None
    util_pct: float | None = None
    mem_used_gib: float | None = None
    mem_total_gib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    ranks: list[int] = field(default_factory=list)
    t: float | None = None


@dataclass
class NodeState:
    """Latest host-side sample of one node."""

    node: int
    host: str | None = None
    cpu_pct: float | None = None
    ram_used_gib: float | None = None
    ram_total_gib: float | None = None
    rank_rss_gib: dict[int, float] = field(default_factory=dict)
    t: float | None = None


class RunView:
    """State of a run, from its `events/` files: `poll()` reads what was appended, `apply()` folds one record in.

    Idempotent: a rank's step is kept once, its last line (`StepIndex`: after a resume, the resumed run's), so
    duplicated lines or a file read twice change nothing. Unknown keys and event kinds are ignored (an unknown event
    still counts as a heartbeat for the stall check).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        straggler_steps: int = 5,
        stall_s: float = 120.0,
        clock: Callable[[], float] = time.time,
        loss_alpha: float = DEFAULT_LOSS_ALPHA,
    ):
        # straggler_steps must exceed the logging interval: between two logged steps ranks legitimately differ
        # by that much while their lines arrive. stall_s must exceed log interval x step time (and the first
        # step's compile/warm-up); it only applies to ranks that have logged a step.
        self.run_dir = Path(run_dir)
        self.straggler_steps = straggler_steps
        self.stall_s = stall_s
        self.clock = clock
        self.loss_alpha = loss_alpha
        self.ranks: dict[int, RankState] = {}
        self.gpus: dict[tuple[int, int], GpuState] = {}  # (node, gpu index) -> state
        self.nodes: dict[int, NodeState] = {}
        # Eval loss and token accuracy by step: global numbers (every rank writes the same), taken from the
        # lowest rank that reports each step.
        self.evals: dict[int, tuple[float | None, float | None]] = {}
        self._eval_lines: dict[int, EvalEvent] = {}
        # The latest answer to each of train.eval_prompts (by its index), from rank 0's `sample` lines.
        self.samples: dict[int, SampleEvent] = {}
        self._tail = DirTail(RunPaths(self.run_dir).events)
        self._world_size: int | None = None

    @property
    def bad_lines(self) -> int:
        return self._tail.bad_lines

    def skip_existing(self) -> None:
        """Start from the files' current ends: a resumed run's view must not replay the old run's lines."""
        while self._tail.read_new():
            pass

    def poll(self) -> bool:
        """Reads new event lines and applies them; True when the state changed."""
        changed = False
        for source, record in self._tail.read_new():
            changed |= self.apply(source, record)
        return changed

    def apply(self, source: str, record: dict[str, Any] | Event) -> bool:
        """Folds one record from `source` ("rank3", "node0") into the state; True when something changed."""
        m = _SOURCE.match(source)
        if m is None:
            return False
        if m.group(1) == "node":
            return self._apply_node(int(m.group(2)), record.line if isinstance(record, Event) else record)
        event = record if isinstance(record, Event) else parse_event(record)
        if event is None:
            return False
        return self._apply_rank(int(m.group(2)) if event.rank is None else event.rank, event)

    # -- per-rank events ---------------------------------------------------------------------------

    def _apply_rank(self, rank: int, ev: Event) -> bool:
        rs = self.ranks.get(rank)
        changed = rs is None
        if rs is None:
            rs = self.ranks[rank] = RankState(rank=rank)
        t = ev.t
        if t is not None and (rs.last_t is None or t > rs.last_t):
            rs.last_t = t
            changed = True
        if isinstance(ev, StepEvent):
            changed |= self._apply_step(rs, ev)
        elif isinstance(ev, StartEvent):
            changed |= self._apply_start(rs, ev)
        elif isinstance(ev, EvalEvent):
            changed |= self._apply_eval(rank, ev)
        elif isinstance(ev, SampleEvent):
            changed |= self._apply_sample(ev)
        elif isinstance(ev, EndEvent):
            if rs.status not in _TERMINAL:
                rs.status = "cancelled" if ev.reason == "cancelled" else "done"
                changed = True
        elif isinstance(ev, ErrorEvent):
            if rs.error_t is None:  # the first error is the cause; later ones are consequences
                rs.status = "failed"
                rs.error_cause = ev.cause
                rs.error_message = ev.message
                rs.error_step = ev.step
                rs.error_t = t if t is not None else float("inf")
                changed = True
        return changed

    def _apply_eval(self, rank: int, ev: EvalEvent) -> bool:
        # Every rank writes the same numbers: the lowest rank that reports a step is kept, its last line for the step
        # (StepIndex's rule: a resumed run evaluates again).
        if ev.step is None:
            return False
        kept = self._eval_lines.get(ev.step)
        if kept is not None and (kept.rank or 0) < rank:
            return False
        self._eval_lines[ev.step] = ev
        value = (ev.number("loss"), ev.number("accuracy"))
        if self.evals.get(ev.step) == value:
            return False
        self.evals[ev.step] = value
        return True

    def _apply_sample(self, ev: SampleEvent) -> bool:
        # A later line for the same or a later step wins (a resumed run samples again); an older step never does.
        if ev.index is None or ev.step is None:
            return False
        kept = self.samples.get(ev.index)
        if kept is not None and (kept.step or 0) > ev.step:
            return False
        self.samples[ev.index] = ev
        return kept is None or kept.text != ev.text or kept.step != ev.step

    def _apply_start(self, rs: RankState, ev: StartEvent) -> bool:
        # Fields absent from this start line keep what an earlier one said.
        before = (rs.node, rs.local_rank, rs.host, rs.pid, rs.max_steps)
        rs.node = ev.node_rank if ev.node_rank is not None else rs.node
        rs.local_rank = ev.local_rank if ev.local_rank is not None else rs.local_rank
        rs.host = ev.host or rs.host
        rs.pid = ev.pid or rs.pid
        rs.max_steps = ev.max_steps if ev.max_steps is not None else rs.max_steps
        changed = before != (rs.node, rs.local_rank, rs.host, rs.pid, rs.max_steps)
        if ev.world_size is not None and ev.world_size > (self._world_size or 0):
            self._world_size = ev.world_size
            changed = True
        return changed

    def _apply_step(self, rs: RankState, ev: StepEvent) -> bool:
        step = ev.step
        if step is None:
            return False
        changed, replaced = rs.steps.add(ev)  # a step logged again (after a resume): the last line counts
        if not changed:
            return False
        if rs.status == "starting":
            rs.status = "running"
        loss, tokens, mem_gib = ev.number("loss"), ev.tokens or 0, ev.mem_gib
        if replaced is not None:
            self._refold(rs)
        else:
            rs.tokens_total += tokens
            if mem_gib is not None and (rs.peak_mem_gib is None or mem_gib > rs.peak_mem_gib):
                rs.peak_mem_gib = mem_gib
            if loss is not None:
                if not rs.losses or step > rs.losses[-1][0]:
                    rs.losses.append((step, loss))
                else:  # not expected from an append-only writer, but history must stay sorted
                    bisect.insort(rs.losses, (step, loss))
                self._smooth(rs, loss)
        if step < rs.step:
            return True
        rs.step = step
        rs.loss = loss
        rs.lr = ev.number("lr")
        rs.grad_norm = ev.number("grad_norm")
        rs.step_s = ev.step_s
        rs.mem_gib = mem_gib
        if rs.recent and rs.recent[-1][0] == step:
            rs.recent.pop()
        rs.recent.append((step, ev.t, tokens, ev.step_s))
        step_s_sum = sum(s for _, _, _, s in rs.recent if s is not None)
        if step_s_sum > 0:
            rs.tokens_per_s = sum(n for _, _, n, s in rs.recent if s is not None) / step_s_sum
        return True

    def _smooth(self, rs: RankState, loss: float) -> None:
        if math.isfinite(loss):
            rs._ema = (1 - self.loss_alpha) * rs._ema + self.loss_alpha * loss
            rs._ema_weight = (1 - self.loss_alpha) * rs._ema_weight + self.loss_alpha
            rs.loss_smooth = rs._ema / rs._ema_weight

    def _refold(self, rs: RankState) -> None:
        """Totals, peak, loss history and smoothing again from the kept lines: a repeated step replaced one."""
        kept = rs.steps.lines()
        rs.tokens_total = sum(e.tokens or 0 for e in kept)
        rs.peak_mem_gib = max((e.mem_gib for e in kept if e.mem_gib is not None), default=None)
        rs.losses = [(e.step, loss) for e in kept if (loss := e.number("loss")) is not None]  # type: ignore[misc]
        rs._ema = rs._ema_weight = 0.0
        rs.loss_smooth = None
        for _, loss in rs.losses:
            self._smooth(rs, loss)

    # -- per-node samples --------------------------------------------------------------------------

    def _apply_node(self, node: int, rec: dict[str, Any]) -> bool:
        if "event" in rec:  # no node events are defined yet; tolerate future ones
            return False
        t = _num(rec, "t")
        ns = self.nodes.get(node)
        if ns is None:
            ns = self.nodes[node] = NodeState(node=node)
        elif t is not None and ns.t is not None and t <= ns.t:
            return False  # duplicate or older sample
        host = _str(rec, "host")
        ns.host, ns.t = host, t
        ns.cpu_pct = _num(rec, "cpu_pct")
        ns.ram_used_gib = _num(rec, "ram_used_gib")
        ns.ram_total_gib = _num(rec, "ram_total_gib")
        rss = rec.get("rank_rss_gib")
        ns.rank_rss_gib = {}
        if isinstance(rss, dict):
            for k, v in rss.items():
                if str(k).isdigit() and isinstance(v, (int, float)) and not isinstance(v, bool):
                    ns.rank_rss_gib[int(k)] = float(v)
        # The sample lists the node's GPUs now: one that is gone from it must not linger with stale numbers.
        for key in [k for k in self.gpus if k[0] == node]:
            del self.gpus[key]
        gpus = rec.get("gpus")
        for g in gpus if isinstance(gpus, list) else []:
            if not isinstance(g, dict) or _int(g, "index") is None:
                continue
            index = _int(g, "index")
            ranks = g.get("ranks")
            self.gpus[(node, index)] = GpuState(
                node=node,
                index=index,
                host=host,
                name=_str(g, "name"),
                uuid=_str(g, "uuid"),
                util_pct=_num(g, "util_pct"),
                mem_used_gib=_num(g, "mem_used_gib"),
                mem_total_gib=_num(g, "mem_total_gib"),
                temp_c=_num(g, "temp_c"),
                power_w=_num(g, "power_w"),
                sm_clock_mhz=_num(g, "sm_clock_mhz"),
                ranks=sorted(r for r in ranks if isinstance(r, int)) if isinstance(ranks, list) else [],
                t=t,
            )
        return True

    # -- derived -----------------------------------------------------------------------------------

    @property
    def eval_curve(self) -> list[tuple[int, float]]:
        """(step, eval loss) sorted by step, finite losses only."""
        return [(s, v[0]) for s, v in sorted(self.evals.items()) if v[0] is not None and math.isfinite(v[0])]

    @property
    def world_size(self) -> int:
        """From the start events; the number of ranks seen until one arrives."""
        return max(self._world_size or 0, len(self.ranks))

    @property
    def max_steps(self) -> int | None:
        known = [r.max_steps for r in self.ranks.values() if r.max_steps is not None]
        return max(known) if known else None

    @property
    def global_step(self) -> int:
        """Steps completed by every rank seen (min over ranks); 0 before any."""
        return min((r.step for r in self.ranks.values()), default=0)

    @property
    def tokens_per_s(self) -> float:
        """Throughput of the whole run: sum of the ranks' recent tokens/s."""
        return sum(r.tokens_per_s for r in self.ranks.values() if r.tokens_per_s is not None)

    @property
    def eta_s(self) -> float | None:
        """Seconds to max_steps: remaining steps x recent seconds per step of the slowest rank (it gates the
        collectives). None when max_steps or the pace is unknown."""
        max_steps = self.max_steps
        if max_steps is None:
            return None
        remaining = max_steps - self.global_step
        if remaining <= 0:
            return 0.0
        paces = [p for r in self.ranks.values() if r.status not in _TERMINAL and (p := r.seconds_per_step())]
        return remaining * max(paces) if paces else None

    def stragglers(self) -> list[int]:
        """Unfinished ranks more than `straggler_steps` behind the most advanced rank."""
        lead = max((r.step for r in self.ranks.values()), default=0)
        return sorted(
            r.rank
            for r in self.ranks.values()
            if r.status in ("starting", "running") and lead - r.step > self.straggler_steps
        )

    def stalled(self) -> list[int]:
        """Running ranks whose latest event is older than `stall_s` (by the injected clock)."""
        now = self.clock()
        return sorted(
            r.rank
            for r in self.ranks.values()
            if r.status == "running" and r.last_t is not None and now - r.last_t > self.stall_s
        )

    def rank_flags(self) -> dict[int, list[str]]:
        """Per rank: its status, then "straggler" / "stall" when they apply; the one rule both views show."""
        stragglers, stalled = set(self.stragglers()), set(self.stalled())
        flags: dict[int, list[str]] = {}
        for r, rs in self.ranks.items():
            flags[r] = [rs.status] + ["straggler"] * (r in stragglers) + ["stall"] * (r in stalled)
        return flags

    def event_age_s(self, rank: int) -> float | None:
        """Seconds since the rank's latest event, by the injected clock."""
        rs = self.ranks.get(rank)
        return None if rs is None or rs.last_t is None else max(0.0, self.clock() - rs.last_t)

    def failed_rank(self) -> int | None:
        """The rank whose error came first (earliest t, then lowest rank): the likely root cause."""
        failed = [r for r in self.ranks.values() if r.error_t is not None]
        return min(failed, key=lambda r: (r.error_t, r.rank)).rank if failed else None

    @property
    def finished(self) -> bool:
        """Any rank failed, or all `world_size` ranks ended."""
        if not self.ranks:
            return False
        if any(r.status == "failed" for r in self.ranks.values()):
            return True
        ended = sum(r.status in _TERMINAL for r in self.ranks.values())
        return ended >= self.world_size
