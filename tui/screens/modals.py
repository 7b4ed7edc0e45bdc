"""Small modal dialogs: a yes/no confirmation, the quit question during a run, a path prompt (save or load a recipe)
and a text to read whole."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True (y / the first button) or False (n / escape / the second button)."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "No", show=False),
    ]

    def __init__(self, question: str, yes: str = "Yes", no: str = "No", danger: bool = False) -> None:
        super().__init__()
        self.question = question
        self.yes = yes
        self.no = no
        self.danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.question, classes="dialog-text", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button(f"{self.yes} (y)", id="yes", variant="error" if self.danger else "primary")
                yield Button(f"{self.no} (n)", id="no")

    def on_mount(self) -> None:
        self.query_one("#no" if self.danger else "#yes", Button).focus()

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")


class QuitDuringRunScreen(ModalScreen["str | None"]):
    """Quit while a run goes on: dismisses with "leave" (quit, the run goes on under its supervisor), "cancel"
    (cancel it, then quit) or None (escape: stay)."""

    BINDINGS = [
        Binding("l", "answer('leave')", "Leave it running"),
        Binding("c", "answer('cancel')", "Cancel it"),
        Binding("escape", "answer(None)", "Stay", show=False),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static("A run is in progress. Quit and leave it running (follow it later with `runner attach`), "
                         "or cancel it and quit?", classes="dialog-text", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Leave it running (l)", id="leave", variant="primary")
                yield Button("Cancel it (c)", id="cancel", variant="error")
                yield Button("Stay (esc)", id="stay")

    def on_mount(self) -> None:
        self.query_one("#leave", Button).focus()

    def action_answer(self, answer: str | None) -> None:
        self.dismiss(answer)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None if event.button.id == "stay" else event.button.id)


class PathPrompt(ModalScreen["str | None"]):
    """Asks for a recipe name or file path; `choices` (recipe names) can be picked from a list."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, value: str = "", choices: list[str] | None = None, action: str = "OK") -> None:
        super().__init__()
        self.title_text = title
        self.value = value
        self.choices = choices or []
        self.action_label = action

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-text")
            yield Input(self.value, id="path")
            if self.choices:
                yield OptionList(*self.choices, id="choices")
            with Horizontal(classes="dialog-buttons"):
                yield Button(self.action_label, id="ok", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#path", Input).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(str(event.option.prompt))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "ok":
            self.dismiss(self.query_one("#path", Input).value.strip() or None)
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class SaveRecipePrompt(ModalScreen["dict[str, str] | None"]):
    """Asks for the recipe's name, description and file; dismisses with {name, description, path} or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, name: str, description: str, path: str) -> None:
        super().__init__()
        self.values = {"name": name, "description": description, "path": path}

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Save the choices as a recipe", classes="dialog-text")
            for key, label in (("name", "run name"), ("description", "description"), ("path", "file (YAML)")):
                yield Label(label, classes="dialog-label")
                yield Input(self.values[key], id=f"save-{key}")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", id="ok", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#save-name", Input).focus()

    def _answer(self) -> dict[str, str]:
        return {k: self.query_one(f"#save-{k}", Input).value.strip() for k in self.values}

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()  # enter in any of the three saves (tab moves between them)
        self.dismiss(self._answer() if self._answer()["path"] else None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(self._answer() if event.button.id == "ok" and self._answer()["path"] else None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class TextScreen(ModalScreen[None]):
    """A text too long for where it was shown (a field's whole meaning), scrolled with ↑/↓; escape closes it."""

    BINDINGS = [Binding("escape", "close", "Close"), Binding("f1", "close", show=False)]

    def __init__(self, title: str, text: str) -> None:
        super().__init__()
        self.title_text = title
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-label")
            with VerticalScroll(id="text-body"):
                yield Static(self.text, markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Close (esc)", id="close", compact=True)

    def on_mount(self) -> None:
        self.query_one("#text-body", VerticalScroll).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
