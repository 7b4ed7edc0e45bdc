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
    _seen_steps: set[int] = field(default_factory=set, repr=False)

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

    Idempotent: a rank's step is taken once (the first line for that step wins), so duplicated lines or a file
    read twice change nothing. Unknown keys and event kinds are ignored (an unknown event still counts as a
    heartbeat for the stall check).
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
        self._tail = DirTail(self.run_dir / "events")
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

    def apply(self, source: str, record: dict[str, Any]) -> bool:
        """Folds one record from `source` ("rank3", "node0") into the state; True when something changed."""
        m = _SOURCE.match(source)
        if m is None:
            return False
        if m.group(1) == "node":
            return self._apply_node(int(m.group(2)), record)
        rank = _int(record, "rank")
        return self._apply_rank(int(m.group(2)) if rank is None else rank, record)

    # -- per-rank events ---------------------------------------------------------------------------

    def _apply_rank(self, rank: int, rec: dict[str, Any]) -> bool:
        rs = self.ranks.get(rank)
        changed = rs is None
        if rs is None:
            rs = self.ranks[rank] = RankState(rank=rank)
        t = _num(rec, "t")
        if t is not None and (rs.last_t is None or t > rs.last_t):
            rs.last_t = t
            changed = True
        event = rec.get("event")
        if event is None:
            if "step" in rec:
                changed |= self._apply_step(rs, rec, t)
        elif event == "start":
            changed |= self._apply_start(rs, rec)
        elif event == "eval":
            step = _int(rec, "step")
            if step is not None and step not in self.evals:
                self.evals[step] = (_num(rec, "loss"), _num(rec, "accuracy"))
                changed = True
        elif event == "end":
            if rs.status not in _TERMINAL:
                rs.status = "cancelled" if rec.get("reason") == "cancelled" else "done"
                changed = True
        elif event == "error":
            if rs.error_t is None:  # the first error is the cause; later ones are consequences
                rs.status = "failed"
                rs.error_cause = _str(rec, "cause")
                rs.error_message = _str(rec, "message")
                rs.error_step = _int(rec, "step")
                rs.error_t = t if t is not None else float("inf")
                changed = True
        return changed

    def _apply_start(self, rs: RankState, rec: dict[str, Any]) -> bool:
        # Fields absent from this start line keep what an earlier one said.
        before = (rs.node, rs.local_rank, rs.host, rs.pid, rs.max_steps)
        rs.node = _int(rec, "node_rank") if rec.get("node_rank") is not None else rs.node
        rs.local_rank = _int(rec, "local_rank") if rec.get("local_rank") is not None else rs.local_rank
        rs.host = _str(rec, "host") or rs.host
        rs.pid = _int(rec, "pid") or rs.pid
        rs.max_steps = _int(rec, "max_steps") if rec.get("max_steps") is not None else rs.max_steps
        changed = before != (rs.node, rs.local_rank, rs.host, rs.pid, rs.max_steps)
        world_size = _int(rec, "world_size")
        if world_size is not None and world_size > (self._world_size or 0):
            self._world_size = world_size
            changed = True
        return changed

    def _apply_step(self, rs: RankState, rec: dict[str, Any], t: float | None) -> bool:
        step = _int(rec, "step")
        if step is None or step in rs._seen_steps:
            return False
        rs._seen_steps.add(step)
        if rs.status == "starting":
            rs.status = "running"
        loss = _num(rec, "loss")
        tokens = _int(rec, "tokens") or 0
        step_s = _num(rec, "step_s")
        mem_gib = _num(rec, "mem_gib")
        rs.tokens_total += tokens
        if mem_gib is not None and (rs.peak_mem_gib is None or mem_gib > rs.peak_mem_gib):
            rs.peak_mem_gib = mem_gib
        if loss is not None:
            if not rs.losses or step > rs.losses[-1][0]:
                rs.losses.append((step, loss))
            else:  # not expected from an append-only writer, but history must stay sorted
                bisect.insort(rs.losses, (step, loss))
            if math.isfinite(loss):
                rs._ema = (1 - self.loss_alpha) * rs._ema + self.loss_alpha * loss
                rs._ema_weight = (1 - self.loss_alpha) * rs._ema_weight + self.loss_alpha
                rs.loss_smooth = rs._ema / rs._ema_weight
        if step < rs.step:
            return True
        rs.step = step
        rs.loss = loss
        rs.lr = _num(rec, "lr")
        rs.grad_norm = _num(rec, "grad_norm")
        rs.step_s = step_s
        rs.mem_gib = mem_gib
        rs.recent.append((step, t, tokens, step_s))
        step_s_sum = sum(s for _, _, _, s in rs.recent if s is not None)
        if step_s_sum > 0:
            rs.tokens_per_s = sum(n for _, _, n, s in rs.recent if s is not None) / step_s_sum
        return True

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
