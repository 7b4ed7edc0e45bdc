"""MemoryBar: predicted per-GPU memory as a stacked bar of its parts against the GPU's capacity, with a legend."""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.widget import Widget

# Neighbouring parts get tokens of different hues (accent and warning are both orange in some themes).
PART_STYLES = ("$primary", "$success", "$warning", "$secondary-lighten-2", "$error-lighten-2", "$primary-lighten-3",
               "$success-darken-2", "$foreground-darken-2", "$accent-darken-2")


class MemoryBar(Widget):
    """`set_estimate(breakdown={part: GiB}, total_gib=..., capacity_gib=...)`; over capacity the bar is drawn to
    the total and the capacity is marked with │ in the error colour."""

    DEFAULT_CSS = """
    MemoryBar { height: auto; min-height: 2; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.breakdown: dict[str, float] = {}
        self.total_gib: float | None = None
        self.capacity_gib: float | None = None
        self.capacity_label = "GPU"

    def set_estimate(self, breakdown: dict[str, Any] | None, total_gib: float | None, capacity_gib: float | None,
                     capacity_label: str = "GPU") -> None:
        self.breakdown = {str(k): float(v) for k, v in (breakdown or {}).items()
                          if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0}
        self.total_gib = total_gib
        self.capacity_gib = capacity_gib
        self.capacity_label = capacity_label
        self.refresh(layout=True)

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self._legend_lines(max(10, width)) or [""]) + 1

    def render(self) -> Content:
        width = max(10, self.content_size.width)
        parts = self.breakdown
        total = self.total_gib if self.total_gib is not None else sum(parts.values())
        cap = self.capacity_gib
        if not parts and not total:
            return Content("no estimate").stylize("$text-muted")
        scale_gib = max(total or 0.0, cap or 0.0) or 1.0
        bar_w = width
        cells: list[Content] = []
        used = 0
        for i, (name, gib_) in enumerate(parts.items()):
            n = round(gib_ / scale_gib * bar_w)
            n = min(n, bar_w - used)
            if n > 0:
                cells.append(Content("█" * n).stylize(PART_STYLES[i % len(PART_STYLES)]))
                used += n
        if cap is not None and cap > 0:
            # At least column 0: a capacity under half a cell of the scale (a plan many times too big) would put
            # the marker at column -1, and the bar would be drawn twice over, onto a second row.
            cap_col = max(0, min(bar_w - 1, round(cap / scale_gib * bar_w) - 1))
            if used <= cap_col:
                cells.append(Content("░" * (cap_col - used)).stylize("$text-muted"))
                cells.append(Content("│").stylize("$text-muted"))
                used = cap_col + 1
            else:
                # Over capacity: overwrite the capacity column with a marker.
                bar = Content("").join(cells)
                cells = [bar[:cap_col], Content("│").stylize("bold $error"), bar[cap_col + 1:]]
        bar = Content("").join(cells)
        legend = self._legend_lines(width)
        return Content("\n").join([bar, *legend])

    def _legend_lines(self, width: int) -> list[Content]:
        items = [Content("").join([Content("■ ").stylize(PART_STYLES[i % len(PART_STYLES)]),
                                   Content(f"{name} {gib_:.2f}" if gib_ < 10 else f"{name} {gib_:.1f}")])
                 for i, (name, gib_) in enumerate(self.breakdown.items())]
        lines: list[Content] = []
        line = Content("")
        for item in items:
            sep = Content("  ") if line.plain else Content("")
            if line.plain and len(line.plain) + 2 + len(item.plain) > width:
                lines.append(line)
                line, sep = Content(""), Content("")
            line = Content("").join([line, sep, item])
        if line.plain:
            lines.append(line)
        return lines
