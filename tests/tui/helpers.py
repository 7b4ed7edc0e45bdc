"""Reading what a screen shows, for Pilot tests: the plain text of a widget, cells of a table."""

from __future__ import annotations

from typing import Any

from textual.widgets import DataTable


def text_of(widget: Any) -> str:
    """The plain text a Static (or any widget with `content`) currently shows."""
    content = getattr(widget, "content", None)
    if content is None:
        content = widget.render()
    plain = getattr(content, "plain", None)
    return plain if isinstance(plain, str) else str(content)


def screen_text(screen: Any, selector: str = "Static") -> str:
    return "\n".join(text_of(w) for w in screen.query(selector))


def table_rows(table: DataTable) -> list[list[str]]:
    out = []
    for row_key in table.rows:
        out.append([getattr(c, "plain", str(c)) for c in table.get_row(row_key)])
    return out


def fill(screen: Any, path: str, text: str) -> None:
    """Type `text` into the wizard field at a dotted spec path, as a person would (Input.Changed flows)."""
    from textual.widgets import Input

    field_id = "f-" + path.replace(".", "-").replace("_", "-")
    control = screen.query_one(f"#{field_id} Input", Input)
    control.value = text


def terminal_text(app: Any) -> str:
    """What the terminal shows now, as plain text, one line per row (for checks that nothing is cut)."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in strip) for strip in strips)
