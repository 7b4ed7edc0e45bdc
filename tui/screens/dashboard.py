"""Dashboard of a run: per-rank loss chart and table, GPU panel, throughput, ETA, log tail, cancel."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Header, Static

from runner import api
from runner.events.monitor import RunView
from tui import format as fmt
from tui.widgets.chart import LossChart
from tui.widgets.footer import KeyFooter

if TYPE_CHECKING:
    from runner.api import RunHandle

POLL_S = 0.5  # new events reach the screen within this plus one frame
LOG_TAIL_BYTES = 16_000
RANK_COLUMNS = ("rank", "node", "step", "loss", "smooth", "tok/s", "mem GiB", "age", "status")


@dataclass
class RunEnded(Message):
    """Posted by the end worker once the record is finished (record None on a node that does not own it)."""

    record: dict[str, Any] | None
    exit_code: int
    replay: dict[str, Any] | None
    error: str | None = None


class DashboardScreen(Screen):
    """Reads `run_dir/events` through a RunView polled on the app thread; with an `active` run (a RunHandle: launched
    here, or attached to from the records browser) it also watches the run, cancels it, and takes its record at the
    end."""

    BINDINGS = [
        Binding("c", "cancel_run", "Cancel"),
        Binding("s", "toggle_smooth", "Smooth"),
        Binding("r", "next_rank", "Next log"),
        Binding("u", "summary", "Summary"),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, run_dir: Path, active: RunHandle | None = None, estimate: dict[str, Any] | None = None,
                 clock: Callable[[], float] = time.time, poll_s: float = POLL_S,
                 original: dict[str, Any] | None = None, attached: bool = False) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        # Opened on a run launched elsewhere (the records browser): Escape leaves it running, as any view may.
        self.attached = attached
        self.run_id = self.run_dir.name
        self.active = active
        self.estimate = estimate
        self.clock = clock
        self.poll_s = poll_s
        self.original = original  # the record being replayed, if this run is a replay
        self.view = active.view(clock) if active is not None else RunView(self.run_dir, clock=clock)
        self.log_rank = 0
        self.smoothed = False
        self.ending = False  # an end worker (cancel or finish) is running or has run
        self.record: dict[str, Any] | None = None
        self.replay: dict[str, Any] | None = None
        self.exit_code: int | None = None
        self._closed = False
        self._log_size: tuple[int | None, int] | None = None  # (file size, steps) last shown
        self._log_rank_shown: int | None = None
        self._row_keys: set[int] = set()
        self._row_cache: dict[int, list[Any]] = {}
        self._notified_failure = False

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Static("", id="run-line")
        with Horizontal(id="dash-top"):
            yield LossChart(alpha=self.view.loss_alpha, id="chart")
            yield Static("", id="gpus")
        yield DataTable(id="ranks", cursor_type="row", zebra_stripes=True)
        yield Static("", id="samples", markup=False)
        with Vertical(id="log-box"):
            yield Static("", id="log-title")
            yield Static("", id="log", markup=False)
        yield Static("", id="banner")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.title = "sft-tui"
        # The title holds one id (the run's), whole at 80 columns; a replay names its original in the banner.
        self.sub_title = ("replay " if self.original else "") + self.run_id
        if self.original:
            self._set_banner(f"replay of {self.original['id']}: the loss curves are compared at the end", "primary")
        table = self.query_one("#ranks", DataTable)
        for name in RANK_COLUMNS:
            table.add_column(name, key=name)
        self._tick(reschedule=False)
        self._schedule()

    def on_unmount(self) -> None:
        self._closed = True

    # -- polling -----------------------------------------------------------------------------------

    def _schedule(self) -> None:
        if not self._closed:
            # A one-shot timer re-armed after each poll: a slow poll delays the next one instead of piling up.
            self.set_timer(self.poll_s, self._tick)

    def _tick(self, reschedule: bool = True) -> None:
        try:
            changed = self.view.poll()
            self.refresh_view(changed)
            self._watch_process()
        finally:
            if reschedule:
                self._schedule()

    def _watch_process(self) -> None:
        if self.active is None or self.ending:
            return
        if self.active.poll() is not None:
            self.ending = True
            self.end_run(cancel=False)

    def refresh_view(self, changed: bool = True) -> None:
        view = self.view
        self._update_run_line()
        if changed:
            chart = self.query_one("#chart", LossChart)
            chart.set_eval(view.eval_curve)
            if self.record is not None or view.finished or view.failed_rank() is not None:
                chart.empty_text = "no step was logged: the run ended before its first step"
            chart.set_series({r: rs.losses for r, rs in view.ranks.items()})
            self._update_gpus()
            self._update_samples()
        self._update_ranks()
        self._update_log()
        failed = view.failed_rank()
        if failed is not None and not self._notified_failure and self.record is None:
            self._notified_failure = True
            rs = view.ranks[failed]
            self._set_banner(f"rank {failed} failed at step {rs.error_step if rs.error_step is not None else '?'}: "
                             f"{rs.error_cause or 'error'}: {rs.error_message or ''}", "error")

    def _update_samples(self) -> None:
        """The latest answer to each of train.eval_prompts with its step, one line each (hidden without prompts)."""
        widget = self.query_one("#samples", Static)
        samples = [self.view.samples[i] for i in sorted(self.view.samples)]
        widget.set_class(bool(samples), "-shown")
        if samples:
            widget.update("\n".join(sample_line(e) for e in samples))

    def _update_run_line(self) -> None:
        view = self.view
        max_steps = view.max_steps
        step = view.global_step
        status, token = self._status()
        line = self.query_one("#run-line", Static)
        parts = [Content(f" {status} ").stylize(f"bold $text-{token} on ${token}-muted"), Content("  "),
                 Content(f"step {step}/{max_steps}" if max_steps else f"step {step}").stylize("bold")]
        tail = Content(f"  {view.tokens_per_s:,.0f} tok/s  ETA {fmt.duration(view.eta_s)}  "
                       f"ranks {len(view.ranks)}/{view.world_size}")
        if max_steps:
            done = min(1.0, step / max_steps)
            percent = Content(f" {100 * done:3.0f}%")
            # The bar takes what the line leaves, up to 20 cells, so the line stays one row at 80 columns.
            room = (line.content_size.width or self.app.size.width - 2) - sum(len(p) for p in parts) - len(tail)
            bar_w = min(20, room - 2 - len(percent))
            if bar_w >= 5:
                filled = round(done * bar_w)
                parts += [Content("  "), Content("━" * filled).stylize("$primary"),
                          Content("━" * (bar_w - filled)).stylize("$text-disabled")]
            parts.append(percent)
        parts.append(tail)
        line.update(Content("").join(parts))

    def _status(self) -> tuple[str, str]:
        if self.record is not None:
            s = self.record.get("status") or "?"
            return s, {"succeeded": "success", "failed": "error", "cancelled": "warning"}.get(s, "primary")
        if self.ending and self.active is not None and self.active.cancelled:
            return "cancelling", "warning"
        if self.view.failed_rank() is not None:
            return "failing", "error"
        if self.ending:
            return "finishing", "primary"
        if self.view.finished:
            return "finished", "success"
        if not self.view.ranks:
            return "starting", "primary"
        return "running", "primary"

    def _update_ranks(self) -> None:
        view = self.view
        table = self.query_one("#ranks", DataTable)
        all_flags = view.rank_flags()
        colors = {k: fmt.theme_color(self.app, k) for k in ("error", "warning", "success")}
        added = False
        for r in sorted(view.ranks):
            rs = view.ranks[r]
            flags = list(all_flags[r])
            if rs.status == "failed" and rs.error_cause:
                flags.append(rs.error_cause)
            style = colors["error"] if rs.status == "failed" else colors["warning"] if len(flags) > 1 else \
                colors["success"] if rs.status == "done" else ""
            age = view.event_age_s(r)
            mem = fmt.gib(rs.mem_gib, 2)
            row = [str(r), "-" if rs.node is None else str(rs.node), str(rs.step), fmt.num(rs.loss, ".4f"),
                   fmt.num(rs.loss_smooth, ".4f"), fmt.num(rs.tokens_per_s, ",.0f"), mem,
                   "-" if age is None else f"{age:.0f}s", Text(" ".join(flags), style=style)]
            if r not in self._row_keys:
                table.add_row(*row, key=str(r))
                self._row_keys.add(r)
                added = True
                self._row_cache[r] = row
                continue
            before = self._row_cache[r]
            for i, (col, value) in enumerate(zip(RANK_COLUMNS, row)):
                if value != before[i]:
                    # A column sized for "-" before the first step must widen to "6.2822": cut to its old width
                    # the loss read "6.28" beside a 4-decimal smooth.
                    table.update_cell(str(r), col, value, update_width=True)
            self._row_cache[r] = row
        if added:  # ranks appear in the order their first event arrives; the table lists them by rank
            table.sort("rank", key=int)
            if str(self.log_rank) in {k.value for k in table.rows}:  # the cursor stays on the rank whose log shows
                table.move_cursor(row=table.get_row_index(str(self.log_rank)))

    def _update_gpus(self) -> None:
        view = self.view
        panel = self.query_one("#gpus", Static)
        est_gib = (self.estimate or {}).get("per_gpu_gib")
        lines: list[Content] = []
        if not view.gpus:
            lines.append(Content("no GPU (CPU run)").stylize("$text-muted"))
            for node, ns in sorted(view.nodes.items()):
                lines.append(Content(f"node {node} {ns.host or ''}").stylize("bold"))
                lines.append(Content(f" CPU {fmt.num(ns.cpu_pct, '.0f')}%  RAM {fmt.gib(ns.ram_used_gib)}/"
                                     f"{fmt.gib(ns.ram_total_gib)} GiB"))
                if ns.rank_rss_gib:
                    rss = "  ".join(f"r{r} {v:.2f}" for r, v in sorted(ns.rank_rss_gib.items()))
                    lines.append(Content(f" RSS GiB {rss}"))
            if est_gib is not None:
                lines.append(Content(f"estimate {fmt.memory_estimate(self.estimate)}").stylize("$text-muted"))
            panel.update(Content("\n").join(lines))
            return
        if est_gib is not None:
            lines.append(Content(f"estimate {fmt.memory_estimate(self.estimate)}").stylize("$text-muted"))
        last_node = None
        for (node, index), g in sorted(view.gpus.items()):
            if node != last_node:
                lines.append(Content(f"node {node} {g.host or ''}").stylize("bold"))
                last_node = node
            util = g.util_pct
            bar_n = 0 if util is None else round(util / 100 * 5)
            near_full = g.mem_used_gib is not None and bool(g.mem_total_gib) and \
                g.mem_used_gib > 0.95 * g.mem_total_gib
            over_est = est_gib is not None and g.mem_used_gib is not None and g.mem_used_gib > 1.1 * est_gib
            lines.append(Content("").join([
                Content(f"{index:>2} "),
                Content("▮" * bar_n).stylize("$success"), Content("▯" * (5 - bar_n)).stylize("$text-muted"),
                Content(f"{fmt.num(util, '4.0f')}% "),
                Content(f"{fmt.gib(g.mem_used_gib)}/{fmt.gib(g.mem_total_gib, 0)}G").stylize(
                    "$text-error" if near_full else "$text-warning" if over_est else ""),
                Content(f" {fmt.num(g.temp_c, '.0f')}° {fmt.num(g.power_w, '.0f')}W"),
            ]))
        panel.update(Content("\n").join(lines))

    def _update_log(self) -> None:
        path = api.run_paths(self.run_dir).rank_log(self.log_rank)
        try:
            size = path.stat().st_size
        except OSError:
            size = None
        rs = self.view.ranks.get(self.log_rank)
        steps = len(rs.losses) if rs is not None else 0
        if (size, steps) == self._log_size and self._log_rank_shown == self.log_rank:
            return
        self._log_size, self._log_rank_shown = (size, steps), self.log_rank
        text = api.log_tail(path, LOG_TAIL_BYTES) if size else ""
        kept, hidden = training_lines(terminal_lines(text) if text else [])
        # The rank's steps come from its events (the log file holds no step lines), then what the rank printed
        # itself: its summary, our warnings, a traceback.
        lines = [step_line(step, loss, self.view.max_steps) for step, loss in (rs.losses if rs else [])][-40:]
        lines = (lines + kept)[-40:] or ["(no output yet)"]
        hidden_note = f"{hidden} library line(s) hidden, all in " if hidden else ""
        self.query_one("#log-title", Static).update(
            Content("").join([Content(f"log of rank {self.log_rank} ").stylize("bold"),
                              Content(f"(r: next)  {hidden_note}").stylize("$text-muted"),
                              Content(fmt.show_path(path)).stylize("$text-muted")]))
        self.query_one("#log", Static).update(Text.from_ansi("\n".join(lines), no_wrap=True, end=""))
        self.query_one("#log", Static).scroll_end(animate=False)

    def _set_banner(self, text: str, token: str) -> None:
        banner = self.query_one("#banner", Static)
        banner.update(Content(text).stylize(f"bold $text-{token}"))
        banner.set_class(True, "-shown")

    # -- actions -----------------------------------------------------------------------------------

    def action_toggle_smooth(self) -> None:
        self.smoothed = not self.smoothed
        self.query_one("#chart", LossChart).set_smoothed(self.smoothed)

    def action_next_rank(self) -> None:
        ranks = sorted(self.view.ranks) or [0]
        i = ranks.index(self.log_rank) if self.log_rank in ranks else -1
        self.log_rank = ranks[(i + 1) % len(ranks)]
        table = self.query_one("#ranks", DataTable)
        if str(self.log_rank) in {k.value for k in table.rows}:
            table.move_cursor(row=table.get_row_index(str(self.log_rank)))
        self._update_log()

    @on(DataTable.RowHighlighted, "#ranks")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            rank = int(event.row_key.value)
            if rank != self.log_rank:
                self.log_rank = rank
                self._update_log()

    def action_cancel_run(self) -> None:
        if self.active is None:
            self.notify("this dashboard is attached to a run it did not launch: cancel it where it was started",
                        severity="warning")
            return
        if self.ending:
            self.notify("the run is already ending", severity="warning")
            return

        def answer(yes: bool | None) -> None:
            if yes and not self.ending:
                self.ending = True
                self._set_banner("cancelling: ranks stop at the next step boundary…", "warning")
                self.end_run(cancel=True)

        self.app.push_screen(self.cancel_dialog(), answer)

    def cancel_dialog(self) -> Any:
        from tui.screens.modals import ConfirmScreen

        return ConfirmScreen(f"Cancel run {self.run_id}?\nRanks stop at the next step boundary; the record is "
                             "finished as cancelled.", yes="Cancel run", no="Keep running", danger=True)

    @work(thread=True, exclusive=True, exit_on_error=False, group="end")
    def end_run(self, cancel: bool) -> None:
        """Cancel (if asked), wait for torchrun, finish the record (which stops the node sampler); posts RunEnded."""
        active = self.active
        record = None
        code = -1
        replay = None
        error = None
        try:
            if cancel:
                active.cancel()
            code = active.wait()
            record = active.finish(code)
            if record is not None and self.original is not None:
                replay = api.replay_result(self.original, record, active.spec)
        except Exception as e:  # noqa: BLE001 - the screen must learn that the end failed
            error = f"{type(e).__name__}: {e}"
        self.post_message(RunEnded(record, code, replay, error))

    def on_run_ended(self, message: RunEnded) -> None:
        self.record = message.record
        self.replay = message.replay
        self.exit_code = message.exit_code
        self.view.poll()
        self.refresh_view(True)
        if message.error:
            self._set_banner(f"could not finish the record: {message.error}", "error")
            self.notify(message.error, title="Run end failed", severity="error", timeout=30)
            return
        rec = message.record or {}
        path = self.active.record_path if self.active is not None else None
        status = rec.get("status", "?")
        failure = rec.get("failure")
        if failure:
            text = failure_sentence(failure)
            self._set_banner(f"{status}: {text}", "error")
            self.notify(text, title=f"Run failed: rank {failure.get('rank')}", severity="error", timeout=30)
        else:
            self._set_banner(f"{status}: record {fmt.show_path(path)}  (u: summary)",
                             "success" if status == "succeeded" else "warning")
        self.app.show_summary(rec, path, message.replay)

    def action_summary(self) -> None:
        if self.record is None:
            self.notify("the summary is ready when the run has ended", severity="information")
            return
        self.app.show_summary(self.record, self.active.record_path if self.active else None, self.replay)

    def action_back(self) -> None:
        if self.active is not None and not self.ending and not self.attached:
            self.notify("the run is still going: cancel it (c) or wait for the end", severity="warning")
            return
        self.app.back_from(self)


def sample_line(e: Any) -> str:
    """`step 20  Name a fruit. → The word`: the answer on one line (the widget cuts what the width cannot hold)."""
    answer = " ".join((e.text or "").split()) or "(empty)"
    return f"step {e.step}  {' '.join((e.prompt or '').split())} → {answer}"


def failure_sentence(failure: dict[str, Any]) -> str:
    """"rank 1 failed at step 4: signal: killed by signal 9 (SIGKILL) (log: runs/…/rank1.log)"."""
    log = failure.get("log")
    return (f"rank {failure.get('rank')} failed at step {failure.get('last_step', '?')}: {failure.get('cause')}: "
            f"{failure.get('message')}" + (f" (log: {fmt.show_path(log)})" if log else ""))


# Library output that says nothing about training: a progress bar ("Loading weights: 100%|███| 46/46"), a Python
# warning ("…/modeling_utils.py:123: FutureWarning: …") and the source line the warning module prints under it.
_PROGRESS = re.compile(r"^[^|]{0,80}:\s*\d{1,3}%\|")
_WARNING = re.compile(r"^\S.*:\d+: [A-Za-z]*Warning: ")


def training_lines(lines: list[str]) -> tuple[list[str], int]:
    """(the lines worth showing, how many were library noise): progress bars and Python warnings are left in the
    log file and out of the pane."""
    kept: list[str] = []
    hidden = 0
    in_warning = False
    for line in lines:
        if _WARNING.match(line) or _PROGRESS.match(line):
            hidden += 1
            in_warning = bool(_WARNING.match(line))
            continue
        if in_warning and line.startswith("  "):  # the warning's source line ("  warnings.warn(")
            hidden += 1
            continue
        in_warning = False
        if line.strip():
            kept.append(line)
    return kept, hidden


def step_line(step: int, loss: float | None, max_steps: int | None) -> str:
    where = f"step {step}/{max_steps}" if max_steps else f"step {step}"
    return f"{where}  loss {fmt.num(loss, '.4f')}"


def terminal_lines(text: str) -> list[str]:
    """The lines a terminal would show for this log text: a progress bar redraws its line with carriage returns
    (tqdm's "Loading weights" writes dozens of states), so each line keeps only what was drawn last."""
    lines = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n")]
    return lines[:-1] if lines and not lines[-1] else lines
