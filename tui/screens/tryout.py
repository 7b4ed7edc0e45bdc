"""Try screen: ask a run's tuned model and its base model the same thing, both answers streamed side by side."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Header, Input, Static

from runner.errors import UserError
from runner.api import TryModel, load_for_try
from tui.widgets.footer import KeyFooter

SIDES = ("tuned", "base")
MAX_NEW_TOKENS = 96


@dataclass
class Side:
    """One model's column: the loaded model (None while loading or after an error) and its own conversation."""

    name: str
    model: TryModel | None = None
    error: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)
    answer: str = ""
    busy: bool = False


class TryScreen(Screen):
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("ctrl+g", "stop", "Stop"),
        Binding("ctrl+n", "forget", "New chat"),
    ]

    def __init__(self, record: dict[str, Any], load: Callable[..., TryModel] = load_for_try) -> None:
        super().__init__()
        self.record = record
        self.load = load
        self.sides = {name: Side(name) for name in SIDES}

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Input(placeholder="ask both models; enter sends", id="try-prompt")
        with Horizontal(id="try-answers"):
            for name in SIDES:
                with Vertical(classes="try-side"):
                    yield Static(name, id=f"try-{name}-title", classes="pane-title", markup=False)
                    with VerticalScroll(id=f"try-{name}"):
                        yield Static("loading…", id=f"try-{name}-text", markup=False)
        yield KeyFooter()

    def on_mount(self) -> None:
        self.title = "sft-tui"
        self.sub_title = f"try {self.record.get('id')}"
        self.query_one("#try-prompt", Input).focus()
        for name in SIDES:
            self._load(name)

    # -- loading and generating happen in thread workers; they reach widgets only through call_from_thread

    @work(thread=True, exit_on_error=False, group="try-load")
    def _load(self, name: str) -> None:
        try:
            model = self.load(self.record, base=name == "base")
        except UserError as e:  # the reason is the message (does not fit, no weights kept)
            self.app.call_from_thread(self._loaded, name, None, str(e))
            return
        except Exception as e:  # noqa: BLE001 - a broken export is shown in its column, the screen lives on
            self.app.call_from_thread(self._loaded, name, None, f"{type(e).__name__}: {e}")
            return
        self.app.call_from_thread(self._loaded, name, model, "")

    def _loaded(self, name: str, model: TryModel | None, error: str) -> None:
        side = self.sides[name]
        side.model, side.error = model, error
        if error:
            self.notify(f"{name} model: {error}", title="cannot load", severity="error")
        self._show(name)

    @work(thread=True, exit_on_error=False)
    def _generate(self, name: str) -> None:
        side = self.sides[name]
        assert side.model is not None
        try:
            answer = side.model.answer(side.messages, MAX_NEW_TOKENS,
                                       on_text=lambda piece: self.app.call_from_thread(self._piece, name, piece))
        except Exception as e:  # noqa: BLE001 - a generation error is shown in its column, the screen lives on
            self.app.call_from_thread(self._done, name, None, f"{type(e).__name__}: {e}")
            return
        self.app.call_from_thread(self._done, name, answer.text, "")

    def _piece(self, name: str, piece: str) -> None:
        self.sides[name].answer += piece
        self._show(name)

    def _done(self, name: str, text: str | None, error: str) -> None:
        side = self.sides[name]
        side.busy = False
        if text is None:
            side.messages.pop()
            side.error = error
        else:
            side.answer = text
            side.messages.append({"role": "assistant", "content": text})
        self._show(name)

    # -- what the user does

    @on(Input.Submitted, "#try-prompt")
    def _ask(self, event: Input.Submitted) -> None:
        prompt = event.value.strip()
        if not prompt:
            return
        if any(s.busy for s in self.sides.values()):
            self.notify("still answering: wait, or ctrl+g to stop", severity="warning")
            return
        event.input.value = ""
        for name, side in self.sides.items():
            if side.model is None:
                continue
            side.messages.append({"role": "user", "content": prompt})
            side.answer, side.busy, side.error = "", True, ""
            self._show(name)
            self._generate(name)

    def action_stop(self) -> None:
        for side in self.sides.values():
            if side.busy and side.model is not None:
                side.model.cancel.set()

    def action_forget(self) -> None:
        if any(s.busy for s in self.sides.values()):
            return
        for name, side in self.sides.items():
            side.messages, side.answer = [], ""
            self._show(name)

    def action_back(self) -> None:
        self.action_stop()
        self.app.pop_screen()

    # -- drawing

    def _show(self, name: str) -> None:
        if not self.is_mounted:  # a worker finishing after the screen was left
            return
        side = self.sides[name]
        title = f"{name}: {side.model.source}" if side.model is not None else name
        self.query_one(f"#try-{name}-title", Static).update(title)
        self.query_one(f"#try-{name}-text", Static).update(side_text(side))
        self.query_one(f"#try-{name}", VerticalScroll).scroll_end(animate=False)


def _blank_runs(text: str) -> str:
    # An answer of empty lines (an untrained base says little else) would scroll the column to nothing.
    return re.sub(r"\n{3,}", lambda m: f"\n⏎ ×{len(m.group())}\n", text)


def side_text(side: Side) -> str:
    """The column's text: the conversation so far, the answer being written last."""
    if side.error and side.model is None:
        return f"cannot load: {side.error}"
    if side.model is None:
        return "loading…"
    lines = []
    for m in side.messages:
        lines.append(("you: " if m["role"] == "user" else "") + _blank_runs(m["content"]))
    if side.busy:
        lines.append(_blank_runs(side.answer) + "▌")
    if side.error:
        lines.append(f"(stopped: {side.error})")
    return "\n".join(lines) or "ready: type a prompt above and press enter"
