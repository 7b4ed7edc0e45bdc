"""Summary of a finished run: status, record, metrics, estimated vs measured memory, failure, exports, replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Header, Static

from tui import format as fmt
from tui.widgets.footer import KeyFooter

STATUS_TOKEN = {"succeeded": "success", "failed": "error", "cancelled": "warning", "running": "primary"}


def _kv(rows: list[tuple[str, str]]) -> Content:
    width = max((len(k) for k, _ in rows), default=0)
    return Content("\n").join(Content(f"  {k:<{width}}  ").stylize("$text-muted") + Content(v) for k, v in rows)


def peak_measured_gib(metrics: dict[str, Any]) -> float | None:
    peaks = [r.get("peak_mem_gib") for r in (metrics.get("per_rank") or {}).values()]
    peaks = [p for p in peaks if isinstance(p, (int, float))]
    return max(peaks) if peaks else None


def exports(record: dict[str, Any]) -> list[str]:
    """What the run left for the user: exported weights (when output.save asked for them) and its folders."""
    out: list[str] = []
    for key in ("exports", "export"):
        value = record.get(key) or (record.get("metrics") or {}).get(key)
        if isinstance(value, dict):
            out += [f"{k}: {fmt.show_path(v)}" for k, v in value.items()]
        elif isinstance(value, list):
            out += [fmt.show_path(v) for v in value]
        elif isinstance(value, str):
            out.append(fmt.show_path(value))
    run_dir = record.get("run_dir")
    if run_dir:
        for name in ("export", "adapter", "model", "checkpoints"):
            p = Path(run_dir) / name
            if p.exists():
                out.append(f"{name}: {fmt.show_path(p)}")
    save = ((record.get("spec") or {}).get("output") or {}).get("save")
    if not out:
        out.append(f"no weights exported (output.save={save})")
    if run_dir:
        out += [f"run folder: {fmt.show_path(run_dir)}", f"logs: {fmt.show_path(Path(run_dir) / 'logs')}",
                f"events: {fmt.show_path(Path(run_dir) / 'events')}"]
    return out


class SummaryScreen(Screen):
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("ctrl+r", "app.records", "Records"),
        Binding("w", "app.new_run", "New run"),
        Binding("t", "try_model", "Try the model"),
    ]

    def __init__(self, record: dict[str, Any], record_path: Path | None, replay: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.record = record
        self.record_path = record_path
        self.replay = replay

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with VerticalScroll(id="summary"):
            yield Static(self._head(), id="summary-head")
            if self.record.get("failure"):
                yield Static(self._failure(), id="summary-failure")
            resume = self._resume()
            if resume is not None:
                yield Static(resume, id="summary-resume")
            if self.replay is not None:
                yield Static(self._replay(), id="summary-replay")
            yield Static("metrics", classes="section")
            yield Static(self._metrics(), id="summary-metrics")
            yield Static("memory per rank", classes="section")
            yield Static(self._memory(), id="summary-memory")
            yield Static("exports", classes="section")
            yield Static(Content("\n").join(Content(f"  {line}") for line in exports(self.record)),
                         id="summary-exports")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.title = "sft-tui"
        self.sub_title = f"summary of {self.record.get('id')}"

    def _head(self) -> Content:
        rec = self.record
        status = rec.get("status") or "?"
        token = STATUS_TOKEN.get(status, "primary")
        rows = [("record", fmt.show_path(self.record_path)), ("id", str(rec.get("id"))),
                ("created", str(rec.get("created"))),
                ("finished", str(rec.get("finished"))), ("lock", (rec.get("lock") or "-")[:16] + "…")]
        if rec.get("replay_of"):
            rows.append(("replay of", rec["replay_of"]))
        title = Content("").join([Content(f" {status.upper()} ").stylize(f"bold $text-{token} on ${token}-muted"),
                                  Content(f"  {rec.get('id')}")])
        return Content("\n").join([title, _kv(rows)])

    def _failure(self) -> Content:
        return failure_content(self.record)

    def _resume(self) -> Content | None:
        """A cancelled run (or one whose supervisor was lost): whether it can be resumed and the command that does
        it, in the CLI's words."""
        from runner.api import resume_sentence

        sentence = resume_sentence(self.record)
        if sentence is None:
            return None
        token = "success" if (self.record.get("cancel") or self.record.get("lost") or {}).get("resumable") \
            else "warning"
        return Content("resume: ").stylize(f"bold $text-{token}") + Content(sentence)

    def _replay(self) -> Content:
        r = self.replay or {}
        ok = r.get("reproduced")
        label = " REPRODUCED " if ok else " NOT REPRODUCED " if r.get("compared", True) else " NOT COMPARED "
        head = Content(label).stylize(
            "bold $text-success on $success-muted" if ok else "bold $text-error on $error-muted")
        text = "  " + r.get("message", f"max |Δloss| = {r.get('max_abs_loss_diff', float('nan')):g} over every "
                                       f"rank and step (tolerance {r.get('tolerance', 0):g})")
        first = r.get("first_divergence")
        if first and not ok:
            text += f"; first divergence at rank {first['rank']} step {first['step']}: {first['original']} → " \
                    f"{first['replay']}"
        return head + Content(text)

    def _metrics(self) -> Content:
        m = self.record.get("metrics") or {}
        rows = [("steps", str(m.get("steps", "-"))),
                ("loss", f"{fmt.num(m.get('first_loss'))} → {fmt.num(m.get('final_loss'))} (all ranks)"),
                ("global loss", fmt.num(m.get("final_global_loss"))),
                ("tokens", f"{m.get('tokens'):,}" if isinstance(m.get("tokens"), int) else "-"),
                ("tokens/s", fmt.num(m.get("tokens_per_s"), ",.0f")),
                ("train time", fmt.duration(m.get("train_s"))),
                ("wall time", fmt.duration(m.get("wall_s"))),
                ("MFU", fmt.num(m.get("mfu"), ".1%"))]
        return _kv(rows)

    def _memory(self) -> Content:
        return memory_content(self.record)

    def action_back(self) -> None:
        self.app.back_from(self)

    def action_try_model(self) -> None:
        from tui.screens.tryout import TryScreen

        self.app.push_screen(TryScreen(self.record))


def failure_content(record: dict[str, Any]) -> Content:
    from tui.screens.dashboard import failure_sentence

    return Content("").join([Content("failure: ").stylize("bold $text-error"),
                             Content(failure_sentence(record["failure"]))])


def memory_content(record: dict[str, Any]) -> Content:
    """The estimate (the same figure and words as the Plan and the dashboard) beside what the ranks measured, and
    an error between like quantities: on GPU PyTorch's peak allocated on both sides, on CPU the memory a rank
    needs against its resident memory (RSS), which is what CPU ranks report."""
    est = record.get("estimate") or {}
    m = record.get("metrics") or {}
    device = ((record.get("spec") or {}).get("hardware") or {}).get("device") or fmt.estimate_device(est)
    measured = peak_measured_gib(m)
    approx = " (approximate)" if est.get("approximate") else ""
    rows = [("estimate", fmt.memory_estimate(est, device) + approx if est.get("per_gpu_gib") is not None
             else "none recorded")]
    if device == "cpu":
        predicted, what = est.get("per_gpu_gib"), "needed vs resident"
        rows.append(("measured peak", f"{fmt.gib(measured, 2)} GiB resident (RSS) per rank, max over ranks"
                     if measured is not None else "-"))
    else:
        predicted, what = est.get("per_gpu_allocated_gib"), "peak allocated, estimated vs measured"
        if predicted is not None:
            rows.append(("of which allocated", f"{fmt.gib(predicted, 2)} GiB (PyTorch's peak allocated)"))
        rows.append(("measured peak", f"{fmt.gib(measured, 2)} GiB allocated per GPU, max over ranks"
                     if measured is not None else "-"))
    if isinstance(predicted, (int, float)) and measured:
        rows.append(("error", f"{100 * (predicted - measured) / measured:+.0f}% ({what})"))
    return _kv(rows)
