"""Records browser: the list of run records, one record's spec, pins and metrics, a diff of two, and replay."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Header, Static, TabbedContent, TabPane

from runner import api
from runner.api import diff_records, list_records, origin, summary_row, verify
from runner.errors import UserError
from tui import format as fmt
from tui.widgets.chart import LossChart
from tui.widgets.footer import KeyFooter

# What tells runs apart comes first (id, status, steps, loss, data, model); the rest scrolls in from the right.
COLUMNS = (("mark", " "), ("id", "id"), ("status", "status"), ("steps", "steps"), ("final_loss", "final loss"),
           ("dataset", "dataset"), ("model", "model"), ("method", "method"), ("origin", "origin"),
           ("tokens_per_s", "tok/s"), ("created", "created"))
STATUS_COLOR = {"succeeded": "success", "failed": "error", "cancelled": "warning", "running": "primary"}


class RecordsScreen(Screen):
    BINDINGS = [
        Binding("enter", "open", "Open"),
        Binding("space", "mark", "Mark"),
        Binding("d", "diff", "Diff marked"),
        Binding("p", "replay", "Replay"),
        Binding("t", "try_model", "Try"),
        Binding("f5", "reload", "Reload"),
        Binding("escape", "back", "Back"),
    ]

    @dataclass
    class ReplayReady(Message):
        record: dict[str, Any]
        spec: Any
        drift: list[dict[str, Any]]
        error: str | None = None

    def __init__(self, records_dir: Path) -> None:
        super().__init__()
        self.records_dir = Path(records_dir)
        self.records: dict[str, dict[str, Any]] = {}
        self.marked: list[str] = []

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Static("", id="records-head")
        yield DataTable(id="records", cursor_type="row", zebra_stripes=True)
        yield KeyFooter()

    def on_mount(self) -> None:
        self.title = "sft-tui"
        self.sub_title = "records"
        table = self.query_one("#records", DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        self.action_reload()
        table.focus()
        self.call_after_refresh(self._update_head)  # the table's width is known after its first layout

    def action_reload(self) -> None:
        table = self.query_one("#records", DataTable)
        table.clear()
        api.reap_lost(self.records_dir)  # a run whose supervisor died is finished as failed, never left `running`
        recs = sorted(list_records(self.records_dir), key=lambda r: (r.get("created") or "", r.get("id") or ""),
                      reverse=True)
        self.records = {r["id"]: r for r in recs if r.get("id")}
        self.marked = [m for m in self.marked if m in self.records]
        colors = {k: fmt.theme_color(self.app, v) for k, v in STATUS_COLOR.items()}
        for rec in self.records.values():
            row = summary_row(rec)
            table.add_row(
                "●" if row["id"] in self.marked else " ",
                row["id"],
                Text(str(row["status"]), style=colors.get(row["status"], "")),
                Text(str(row["steps"] or 0), justify="right"),
                Text(fmt.num(row["final_loss"]), justify="right"),
                row["dataset"] or "-",
                row["model"] or "-",
                row["method"],
                Text(origin(row)),  # "replay of <id>", "resumed ×N", as `runner list` says it
                Text(fmt.num(row["tokens_per_s"], ",.0f"), justify="right"),
                (row["created"] or "")[:16].replace("T", " "),
                key=row["id"],
            )
        self._update_head()

    def _update_head(self) -> None:
        n = len(self.records)
        text = f"{n} record{'s' if n != 1 else ''} in {fmt.show_path(self.records_dir)}"
        if self.marked:
            text += f" · marked: {', '.join(self.marked)}"
        live = sum(api.is_live(r) for r in self.records.values())
        if live:
            text += f" · {live} running (enter: live dashboard)"
        hint = "  (space: mark two, d: diff · enter: open · p: replay)"
        table = self.query_one("#records", DataTable)
        # From the columns themselves, not the table's layout: that is not done yet right after a reload.
        needed = sum(col.get_render_width(table) for col in table.columns.values())
        if needed > (table.size.width or self.app.size.width):
            hint += " · ←/→: more columns"
        self.query_one("#records-head", Static).update(Content(text) + Content(hint).stylize("$text-muted"))

    def on_resize(self) -> None:
        self.call_after_refresh(self._update_head)

    def _current(self) -> dict[str, Any] | None:
        table = self.query_one("#records", DataTable)
        if not self.records or table.cursor_row < 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return self.records.get(key)

    def action_mark(self) -> None:
        rec = self._current()
        if rec is None:
            return
        rid = rec["id"]
        if rid in self.marked:
            self.marked.remove(rid)
        else:
            self.marked.append(rid)
            self.marked = self.marked[-2:]
        table = self.query_one("#records", DataTable)
        for key in self.records:
            table.update_cell(key, "mark", "●" if key in self.marked else " ")
        self._update_head()

    def action_open(self) -> None:
        rec = self._current()
        if rec is not None and api.is_live(rec):
            self._open_live(rec)
        elif rec is not None:
            self.app.push_screen(RecordScreen(rec, self.records_dir / f"{rec['id']}.json"))

    def action_try_model(self) -> None:
        from tui.screens.tryout import TryScreen

        rec = self._current()
        if rec is not None:
            self.app.push_screen(TryScreen(rec))

    def _open_live(self, rec: dict[str, Any]) -> None:
        """A running run opens its live dashboard, attached to its supervisor: it can be cancelled from there."""
        from tui.screens.dashboard import DashboardScreen

        try:
            active = api.attach(rec["run_dir"], Path(rec["run_dir"]).parent)
        except UserError as e:
            self.notify(str(e), severity="warning")
            self.app.push_screen(RecordScreen(rec, self.records_dir / f"{rec['id']}.json"))
            return
        active.spec = rec.get("spec")
        self.app.push_screen(DashboardScreen(active.paths.run_dir, active=active, estimate=rec.get("estimate"),
                                             clock=self.app.clock, poll_s=self.app.poll_s, attached=True))

    @on(DataTable.RowSelected, "#records")
    def _row_selected(self) -> None:
        self.action_open()

    def action_diff(self) -> None:
        ids = list(self.marked)
        cur = self._current()
        if len(ids) == 1 and cur is not None and cur["id"] not in ids:
            ids.append(cur["id"])
        if len(ids) != 2:
            self.notify("mark two records with space (or one, with the cursor on the other), then press d",
                        severity="warning")
            return
        self.app.push_screen(DiffScreen(self.records[ids[0]], self.records[ids[1]]))

    def action_replay(self) -> None:
        rec = self._current()
        if rec is None:
            return
        if rec.get("status") == "running":
            self.notify("this record is still running (or its run died without finishing it): nothing to compare",
                        severity="warning")
            return
        self.notify(f"checking {rec['id']} and the current environment…", timeout=3)
        self.prepare_replay(rec["id"])

    @work(thread=True, exclusive=True, exit_on_error=False, group="replay")
    def prepare_replay(self, record_id: str) -> None:
        """Verify the lock, rebuild the spec, and list the pins that drifted (as `runner replay` does)."""
        try:
            prepared = api.prepare_replay(self.records_dir / f"{record_id}.json", len(self.app.detected_gpus()))
            self.post_message(self.ReplayReady(prepared.original, prepared.spec, prepared.drift))
        except (UserError, api.RecordError) as e:
            self.post_message(self.ReplayReady({"id": record_id}, None, [], str(e)))
        except Exception as e:  # noqa: BLE001
            self.post_message(self.ReplayReady({"id": record_id}, None, [], f"{type(e).__name__}: {e}"))

    def on_records_screen_replay_ready(self, message: ReplayReady) -> None:
        from tui.screens.modals import ConfirmScreen

        if message.error:
            self.notify(message.error, title="Cannot replay", severity="error", timeout=15)
            return
        rows = message.drift
        if rows:
            listed = "\n".join(f"  {r['pin']}: {r['recorded']} → {r['current']}" +
                               (" (strict)" if r["strict"] else "") for r in rows[:8])
            more = f"\n  … and {len(rows) - 8} more" if len(rows) > 8 else ""
            drift_text = f"{len(rows)} pin(s) differ from the record:\n{listed}{more}"
        else:
            drift_text = "pins: identical to the record"
        rec = message.record

        def answer(yes: bool | None) -> None:
            if yes:
                self.app.start_run(message.spec, original=rec)

        self.app.push_screen(ConfirmScreen(f"Replay {rec['id']}?\n{drift_text}\nThe new run's loss curve is compared "
                                           "with the record's at the end.", yes="Replay", no="Cancel"), answer)

    def action_back(self) -> None:
        self.app.back_from(self)


def _yaml(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=100).rstrip()


def pins_summary(pins: dict[str, Any]) -> dict[str, Any]:
    """The pins a person looks at first; the full set is in the record file."""
    git = pins.get("git") or {}
    model = pins.get("model") or {}
    dataset = pins.get("dataset") or {}
    out = {
        "python": pins.get("python"),
        "torch": pins.get("torch"),
        "cuda": pins.get("cuda"),
        "nccl": pins.get("nccl"),
        "gpus": (pins.get("gpus") or {}).get("names") if isinstance(pins.get("gpus"), dict) else pins.get("gpus"),
        "git": {k: git.get(k) for k in ("commit", "dirty", "diff_sha256") if k in git},
        "model": {k: v for k, v in model.items() if not isinstance(v, (dict, list))},
        "dataset": {k: v for k, v in dataset.items() if not isinstance(v, (dict, list))},
        "tokenizer_sha256": pins.get("tokenizer_sha256"),
        "packages": {k: v for k, v in (pins.get("packages") or {}).items()
                     if k in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "textual", "sft-tui")},
    }
    return {k: v for k, v in out.items() if v not in (None, {}, [])}


class RecordScreen(Screen):
    """One record: overview, spec, pins and metrics in tabs; the lock is verified on open."""

    BINDINGS = [Binding("escape", "back", "Back")]

    def __init__(self, record: dict[str, Any], path: Path) -> None:
        super().__init__()
        self.record = record
        self.path = path

    def compose(self) -> ComposeResult:
        rec = self.record
        yield Header(show_clock=False)
        with TabbedContent(id="record-tabs"):
            with TabPane("Overview", id="tab-overview"):
                with VerticalScroll():
                    yield Static(self._overview(), id="record-overview")
                    curves = (rec.get("metrics") or {}).get("loss_curve") or {}
                    if curves:
                        chart = LossChart(id="record-chart")
                        # A finished record waits for nothing: an empty curve means no step was ever logged.
                        chart.empty_text = f"no step was logged: the run {rec.get('status')} before its first step"
                        chart.set_series({int(r): [(int(s), float(v)) for s, v in c if v is not None]
                                          for r, c in curves.items()})
                        yield chart
            with TabPane("Spec", id="tab-spec"):
                with VerticalScroll():
                    yield Static(_yaml(rec.get("spec") or {}), markup=False, id="record-spec")
            with TabPane("Pins", id="tab-pins"):
                with VerticalScroll():
                    yield Static(_yaml(pins_summary(rec.get("pins") or {})), markup=False, id="record-pins")
            with TabPane("Metrics", id="tab-metrics"):
                with VerticalScroll():
                    m = dict(rec.get("metrics") or {})
                    curves = m.pop("loss_curve", None) or {}
                    m["loss_curve"] = {r: f"{len(c)} points" for r, c in curves.items()}
                    yield Static(_yaml(m), markup=False, id="record-metrics")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.title = "sft-tui"
        self.sub_title = f"record {self.record.get('id')}"

    def _overview(self) -> Content:
        from tui.screens.summary import failure_content, memory_content

        try:
            ok, reason = verify(self.path)
        except api.RecordError as e:
            ok, reason = False, str(e)
        row = summary_row(self.record)
        lines = [
            Content(f"{row['id']}").stylize("bold"),
            Content(f"  file     {fmt.show_path(self.path)}"),
            Content("  lock     ") + (Content("✓ verified").stylize("$text-success") if ok else
                                      Content(f"✗ {reason}").stylize("$text-error")),
            Content(f"  status   {row['status']}"),
            Content(f"  model    {row['model']}   method {row['method']}"),
            *[Content(f"  {'dataset' if i == 0 else '':<7}  {part}") for i, part in enumerate(
                textwrap.wrap(dataset_line(self.record.get("spec") or {}), 64, break_on_hyphens=False))],
            Content(f"  steps    {row['steps']}   final loss {fmt.num(row['final_loss'])}   tok/s "
                    f"{fmt.num(row['tokens_per_s'], ',.0f')}"),
        ]
        if row.get("replay_of"):
            lines.append(Content(f"  replay of {row['replay_of']}"))
        launch = self.record.get("launch") or {}
        if launch.get("command"):
            # Wrapped under itself (at 80 columns too), not back to column 0.
            wrapped = textwrap.wrap(launch["command"], 64, break_long_words=False, break_on_hyphens=False)
            lines += [Content(f"  {'command' if i == 0 else '':<7}  {part}") for i, part in enumerate(wrapped)]
        if self.record.get("failure"):
            lines.append(failure_content(self.record))
        lines.append(Content("memory").stylize("bold"))
        lines.append(memory_content(self.record))
        return Content("\n").join(lines)

    def action_back(self) -> None:
        self.app.back_from(self)


def dataset_line(spec: dict[str, Any]) -> str:
    """The data a record trained on, as a new user set it: its name, the file, and the format and columns when
    they were set (`local/qa (qa.json) · alpaca · instruction=question, output=answer`)."""
    from runner.api import dataset_name

    ds = spec.get("dataset") or {}
    parts = [str(dataset_name(spec) or "-")]
    path = ds.get("path")
    if path and not str(path).startswith("embedded:"):
        parts[0] += f" ({fmt.show_path(path)})"
    if ds.get("format") not in (None, "auto"):
        parts.append(str(ds["format"]))
    if ds.get("columns"):
        parts.append(", ".join(f"{k}={v}" for k, v in ds["columns"].items()))
    return " · ".join(parts)


class DiffScreen(Screen):
    """Only what differs between two records (spec, pins, launch, metrics, status, failure)."""

    BINDINGS = [Binding("escape", "back", "Back")]

    def __init__(self, a: dict[str, Any], b: dict[str, Any]) -> None:
        super().__init__()
        self.a = a
        self.b = b
        self.rows: list[tuple[str, Any, Any]] = []

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Static("", id="diff-head")
        yield DataTable(id="diff", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="diff-detail-box"):  # tab, then ↑/↓: a value longer than the box scrolls
            yield Static("", id="diff-detail", markup=False)
        yield KeyFooter()

    def on_mount(self) -> None:
        self.title = "sft-tui"
        self.sub_title = "diff"
        rows = diff_records(self.a, self.b)
        head = self.query_one("#diff-head", Static)
        head.update(Content("").join([Content("A ").stylize("bold"), Content(str(self.a.get("id"))),
                                      Content("  B ").stylize("bold"), Content(str(self.b.get("id"))),
                                      Content(f"  ({len(rows)} differ)").stylize("$text-muted")]))
        table = self.query_one("#diff", DataTable)
        table.add_column("field", key="field")
        table.add_column("A", key="a")
        table.add_column("B", key="b")
        if not rows:
            table.add_row("(no differences in spec, pins or metrics)", "", "")
        # Both values in view, in what the field names leave; the selected row's are shown whole below the table.
        names = max((len(k) for k, _, _ in rows), default=10)
        width_a, width_b = value_widths(rows, self.app.size.width - names - 8)
        self.rows = rows
        for key, va, vb in rows:
            table.add_row(key, _short(va, width_a), _short(vb, width_b))
        table.focus()
        self._show_detail(0)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail(event.cursor_row)

    def _show_detail(self, i: int) -> None:
        """The selected row's field and both values in full, wrapped: the table cuts values to fit its columns."""
        detail = self.query_one("#diff-detail", Static)
        box = self.query_one("#diff-detail-box", VerticalScroll)
        if not 0 <= i < len(self.rows):
            box.display = False
            return
        key, va, vb = self.rows[i]
        box.display = True
        box.scroll_home(animate=False)
        detail.update(f"{key}\nA: {_text(va)}\nB: {_text(vb)}")

    def action_back(self) -> None:
        self.app.back_from(self)


def value_widths(rows: list[tuple[str, Any, Any]], room: int) -> tuple[int, int]:
    """Widths of the A and B columns in `room` cells: each its longest value when both fit; else a column that
    needs under half keeps what it needs and the other takes the rest; else half each (at least 12)."""
    need_a = max((len(_text(a)) for _, a, _ in rows), default=1)
    need_b = max((len(_text(b)) for _, _, b in rows), default=1)
    if need_a + need_b <= room:
        return need_a, need_b
    half = max(12, room // 2)
    if min(need_a, need_b) <= half:
        return (need_a, max(12, room - need_a)) if need_a <= need_b else (max(12, room - need_b), need_b)
    return half, half


def _text(v: Any) -> str:
    return "-" if v is None else str(v)


def _short(v: Any, width: int = 44) -> Text:
    s = "-" if v is None else str(v)
    return Text(s if len(s) <= width else s[: width - 1] + "…")  # Text, not str: DataTable parses strings as markup
