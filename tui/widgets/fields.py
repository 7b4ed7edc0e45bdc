"""SpecField: one spec field as a labelled input, select or switch, with its problems shown beneath it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Input, Label, Select, Static, Switch

from runner.errors import Problem

Kind = Literal["text", "optional", "int", "optional_int", "float", "optional_float", "int_or_auto", "modules", "list",
               "mapping", "select", "switch"]


def parse_value(kind: Kind, text: str) -> Any:
    """What the spec dict gets for the text typed into a field: numbers when they parse, else the text itself so
    runner.spec reports it ("Input should be a valid integer, got "abc"")."""
    s = text.strip()
    if kind in ("optional", "optional_int", "optional_float") and s == "":
        return None
    if kind in ("int", "optional_int", "int_or_auto"):
        if kind == "int_or_auto" and s == "auto":
            return s
        try:
            return int(s)
        except ValueError:
            return s
    if kind in ("float", "optional_float"):
        try:
            return float(s)
        except ValueError:
            return s
    if kind == "list":  # comma-separated names; empty = none
        return [p.strip() for p in s.split(",") if p.strip()]
    if kind == "mapping":  # "key=value, key=value"; empty = none; a piece without "=" goes to the spec as typed,
        # so its check names what a mapping takes
        pairs = [p.split("=", 1) for p in s.split(",") if p.strip()]
        if any(len(p) != 2 or not p[0].strip() for p in pairs):
            return text
        return {k.strip(): v.strip() for k, v in pairs}
    if kind == "modules":
        if "," in s:
            return [p.strip() for p in s.split(",") if p.strip()]
        return s
    return text


def show_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, float):
        return format(value, "g")
    return str(value)


class SpecField(Vertical):
    """A field of the spec dict at a dotted `path`; posts SpecField.Changed with the parsed value on each edit."""

    DEFAULT_CSS = """
    SpecField { height: auto; }
    SpecField > Horizontal { height: auto; }
    SpecField .field-label { width: 22; padding: 0 1 0 0; color: $text-muted; }
    SpecField Input, SpecField Select { width: 1fr; }
    SpecField Switch { border: none; height: 1; padding: 0 1; width: auto; }
    SpecField Switch:focus { background: $boost; text-style: reverse; }
    SpecField .field-problem { display: none; color: $text-error; padding: 0 0 0 22; height: auto; }
    SpecField.-invalid .field-problem { display: block; }
    SpecField.-invalid .field-label { color: $text-error; text-style: bold; }
    SpecField.-invalid Input { background: $error 20%; }
    """

    @dataclass
    class Changed(Message):
        field: "SpecField"
        path: str
        value: Any

    @dataclass
    class Focused(Message):
        path: str
        doc: str

    def __init__(self, path: str, label: str, value: Any, kind: Kind = "text", doc: str = "",
                 options: Sequence[Any] | None = None, placeholder: str = "") -> None:
        super().__init__(id="f-" + path.replace(".", "-").replace("_", "-"))
        self.path = path
        self.label = label
        self.kind = kind
        self.doc = doc
        self.options = list(options or [])
        self.placeholder = placeholder
        self._value = value

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Label(self.label, classes="field-label")
            if self.kind == "select":
                options = list(self.options)
                if self._value is not None and self._value not in options:
                    options.append(self._value)
                yield Select([(str(o), o) for o in options], value=self._value if self._value in options else
                             Select.NULL, allow_blank=False, compact=True)
            elif self.kind == "switch":
                yield Switch(bool(self._value))
            else:
                yield Input(show_value(self._value), placeholder=self.placeholder, compact=True)
        yield Static("", classes="field-problem", markup=False)

    def on_mount(self) -> None:
        control = self.control
        control.tooltip = self.doc or None

    @property
    def control(self) -> Input | Select[Any] | Switch:
        return self.query_one("Input, Select, Switch")  # type: ignore[return-value]

    def set_value(self, value: Any) -> None:
        """Show `value` without echoing a Changed back (used when a recipe is loaded)."""
        self._value = value
        control = self.control
        with control.prevent(Input.Changed, Select.Changed, Switch.Changed):
            if isinstance(control, Select):
                if value not in self.options:
                    self.options.append(value)
                    control.set_options([(str(o), o) for o in self.options])
                control.value = value
            elif isinstance(control, Switch):
                control.value = bool(value)
            else:
                control.value = show_value(value)

    def set_problems(self, problems: list[Problem]) -> None:
        text = "\n".join(f"✗ {p.message}" + (f" — fix: {p.fix}" if p.fix else "") for p in problems)
        self.query_one(".field-problem", Static).update(text)
        self.set_class(bool(problems), "-invalid")

    def _post(self, value: Any) -> None:
        self._value = value
        self.post_message(self.Changed(self, self.path, value))

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._post(parse_value(self.kind, event.value))

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if event.value is not Select.NULL:
            self._post(event.value)

    def on_switch_changed(self, event: Switch.Changed) -> None:
        event.stop()
        self._post(bool(event.value))

    def on_descendant_focus(self) -> None:
        self.post_message(self.Focused(self.path, self.doc))
