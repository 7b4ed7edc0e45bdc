"""Headless live display of a run: a rich Live view on a TTY, one plain line per logged step otherwise."""

from __future__ import annotations

import math

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from runner.events.monitor import RankState, RunView

# Beyond this many ranks the table shows the flagged ranks first, then the lowest, so that it fits a terminal.
MAX_RANK_ROWS = 16


def format_duration(seconds: float | None) -> str:
    """H:MM:SS, or "?" when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _step_text(step: int, max_steps: int | None) -> str:
    return f"{step}/{max_steps}" if max_steps is not None else str(step)


def eval_line(step: int, loss: float | None, accuracy: float | None) -> str:
    acc = "-" if accuracy is None else f"{100 * accuracy:.1f}%"
    return f"eval at step {step}: loss {_f(loss, '.4f')}  token accuracy {acc}"


class HeadlessDisplay:
    """Shows a RunView: call `update()` after each `view.poll()`, `close()` at the end.

    TTY (or `plain=False`): a rich Live view, progress line, per-rank table, GPU table once GPU samples exist.
    Otherwise (or `plain=True`): plain lines for a log file, without ANSI: one per step the lead rank (the lowest)
    logged, also when several arrive between two updates (the rates and ETA are those of the latest), one when a
    rank fails, one when the run ends. `lost`, set when the supervisor died, makes the end line say so.
    """

    def __init__(self, view: RunView, console: Console | None = None, plain: bool | None = None):
        self.view = view
        self.console = console or Console()
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self._printed_step = 0
        self._printed_evals = 0
        self._printed_samples: set[tuple[int, int | None]] = set()
        self._reported_failures: set[int] = set()
        self._reported_end = False
        self.lost = False
        self._live: Live | None = None
        if not self.plain:
            self._live = Live(self._render(), console=self.console, auto_refresh=False, transient=False)
            self._live.start()

    def update(self) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
        else:
            self._update_plain()

    def close(self) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
            self._live.stop()
            self._live = None
        else:
            self._update_plain()

    # -- plain -------------------------------------------------------------------------------------

    def _out(self, line: str) -> None:
        # Console.out: no markup, no wrapping at the console width, no highlighting -> a clean log line.
        self.console.out(line, highlight=False)

    def _update_plain(self) -> None:
        view = self.view
        if view.ranks:
            lead = view.ranks[min(view.ranks)]
            for step in range(self._printed_step + 1, lead.step):  # logged since the last update: none left out
                past = lead.steps.get(step)
                if past is not None:
                    self._out(f"step {_step_text(step, view.max_steps)}  loss {_f(past.loss, '.3f')}  "
                              f"lr {_f(past.lr, '.1e')}  mem {_f(past.mem_gib, '.1f')} GiB")
            if lead.step > self._printed_step:
                self._printed_step = lead.step
                self._out(self._step_line(lead))
        for step in sorted(view.evals)[self._printed_evals:]:
            self._printed_evals += 1
            self._out(eval_line(step, *view.evals[step]))
        self._print_samples()
        for rs in sorted(view.ranks.values(), key=lambda r: (r.error_t or 0.0, r.rank)):
            if rs.status == "failed" and rs.rank not in self._reported_failures:
                self._reported_failures.add(rs.rank)
                step = "?" if rs.error_step is None else rs.error_step
                self._out(f"rank {rs.rank} failed at step {step}: {rs.error_cause or rs.error_message or 'unknown'}")
        if view.finished and not self._reported_end:
            self._reported_end = True
            self._out(self._end_line())

    def _print_samples(self) -> None:
        for index, e in sorted(self.view.samples.items()):
            if (index, e.step) not in self._printed_samples:
                self._printed_samples.add((index, e.step))
                self._out(f"sample at step {e.step}: {e.prompt!r} -> {e.text!r}")

    def _step_line(self, lead: RankState) -> str:
        view = self.view
        parts = [
            f"step {_step_text(lead.step, view.max_steps)}",
            f"loss {_f(lead.loss, '.3f')}",
            f"lr {_f(lead.lr, '.1e')}",
            f"tok/s {view.tokens_per_s:,.0f}",
            f"mem {_f(lead.mem_gib, '.1f')} GiB",
        ]
        if view.eta_s is not None:
            parts.append(f"eta {format_duration(view.eta_s)}")
        return "  ".join(parts)

    def _end_line(self) -> str:
        view = self.view
        if self.lost:  # the ranks stopped as if cancelled (SIGTERM from the kernel), but nobody cancelled
            return f"run failed at step {view.global_step}: supervisor lost"
        failed = view.failed_rank()
        if failed is not None:
            return f"run failed (first: rank {failed}) at step {view.global_step}"
        statuses = {r.status for r in view.ranks.values()}
        outcome = "cancelled" if "cancelled" in statuses else "done"
        return f"run {outcome} at step {_step_text(view.global_step, view.max_steps)}"

    # -- rich --------------------------------------------------------------------------------------

    def _render(self) -> RenderableType:
        parts: list[RenderableType] = [self._progress_line(), self._rank_table()]
        if self.view.gpus:
            parts.append(self._gpu_table())
        return Group(*parts)

    def _progress_line(self) -> Text:
        view = self.view
        line = Text()
        line.append(f"step {_step_text(view.global_step, view.max_steps)}", style="bold")
        if view.max_steps:
            line.append(f"  {100 * view.global_step / view.max_steps:.0f}%")
        line.append(f"  eta {format_duration(view.eta_s)}  tok/s {view.tokens_per_s:,.0f}")
        line.append(f"  ranks {len(view.ranks)}/{view.world_size}")
        if view.evals:
            step = max(view.evals)
            line.append(f"  {eval_line(step, *view.evals[step])}", style="cyan")
        failed = view.failed_rank()
        if failed is not None:
            line.append(f"  rank {failed} failed", style="bold red")
        elif view.finished:
            line.append("  finished", style="bold green")
        return line

    def _rank_table(self) -> Table:
        view = self.view
        all_flags = view.rank_flags()
        flagged = {r for r, f in all_flags.items() if len(f) > 1 or f[0] == "failed"}
        shown = sorted(flagged)[:MAX_RANK_ROWS]
        shown = sorted(shown + [r for r in sorted(view.ranks) if r not in flagged][: MAX_RANK_ROWS - len(shown)])
        table = Table(box=None, pad_edge=False, expand=False)
        for name in ("rank", "node", "step", "loss", "smooth", "tok/s", "mem GiB", "age", "status"):
            table.add_column(name, justify="left" if name == "status" else "right")
        for r in shown:
            rs = view.ranks[r]
            flags = all_flags[r]
            style = "red" if rs.status == "failed" else "yellow" if len(flags) > 1 else None
            age = view.event_age_s(r)
            table.add_row(
                str(r),
                "-" if rs.node is None else str(rs.node),
                str(rs.step),
                _f(rs.loss, ".4f"),
                _f(rs.loss_smooth, ".4f"),
                _f(rs.tokens_per_s, ",.0f"),
                f"{_f(rs.mem_gib, '.1f')}/{_f(rs.peak_mem_gib, '.1f')}",
                "-" if age is None else f"{age:.0f}s",
                Text(" ".join(flags), style=style or ""),
            )
        if len(shown) < len(view.ranks):
            table.caption = f"showing {len(shown)} of {len(view.ranks)} ranks (flagged first)"
        return table

    def _gpu_table(self) -> Table:
        table = Table(box=None, pad_edge=False, expand=False)
        for name in ("node", "gpu", "util %", "mem GiB", "temp C", "power W", "ranks"):
            table.add_column(name, justify="right")
        for (node, index), g in sorted(self.view.gpus.items()):
            table.add_row(
                str(node),
                str(index),
                _f(g.util_pct, ".0f"),
                f"{_f(g.mem_used_gib, '.1f')}/{_f(g.mem_total_gib, '.1f')}",
                _f(g.temp_c, ".0f"),
                _f(g.power_w, ".0f"),
                ",".join(map(str, g.ranks)) or "-",
            )
        return table
