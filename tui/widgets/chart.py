"""LossChart: per-rank loss curves drawn with braille dots (2×4 per cell), y labels, step axis and a legend."""

from __future__ import annotations

import math
from collections.abc import Sequence

from textual.content import Content, Span
from textual.widget import Widget

# Theme tokens, so that the curves read on dark and light themes; ranks beyond the list reuse it.
SERIES_STYLES = ("$primary", "$accent", "$success", "$warning", "$secondary", "$foreground", "$error",
                 "$text-muted")
LABEL_W = 8  # y-axis labels such as " 6.2551 "
BRAILLE_BASE = 0x2800
# Dot bit of braille pixel (x in 0..1, y in 0..3) inside a cell.
_DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
MAX_LEGEND = 16
EVAL = -1  # series key of the eval loss curve (ranks are 0..N-1)
EVAL_STYLE = "bold $error"


def smooth(points: Sequence[tuple[int, float]], alpha: float) -> list[tuple[int, float]]:
    """Bias-corrected EMA over the finite losses, the curve RunView's `loss_smooth` is the end of."""
    out: list[tuple[int, float]] = []
    ema = weight = 0.0
    for step, loss in points:
        if not math.isfinite(loss):
            continue
        ema = (1 - alpha) * ema + alpha * loss
        weight = (1 - alpha) * weight + alpha
        out.append((step, ema / weight))
    return out


def _downsample(points: Sequence[tuple[int, float]], x_of, buckets: int) -> list[tuple[int, float]]:
    """At most first/min/max/last per pixel column: the shape survives, the cost stays O(columns) to draw."""
    if len(points) <= 2 * buckets:
        return list(points)
    out: list[tuple[int, float]] = []
    col = None
    group: list[tuple[int, float]] = []
    for p in points:
        c = x_of(p[0])
        if c != col and group:
            lo, hi = min(group, key=lambda q: q[1]), max(group, key=lambda q: q[1])
            out.extend(sorted({group[0], lo, hi, group[-1]}))
            group = []
        col = c
        group.append(p)
    if group:
        lo, hi = min(group, key=lambda q: q[1]), max(group, key=lambda q: q[1])
        out.extend(sorted({group[0], lo, hi, group[-1]}))
    return out


def label_decimals(largest: float) -> int:
    """One precision for every y label, the most that fits LABEL_W beside the largest one's integer digits (4 for
    losses under 10, as the rank table shows them): labels that mix precisions read as different quantities."""
    digits = len(str(int(abs(largest)))) + (largest < 0)
    return max(0, min(4, LABEL_W - 3 - digits))


class _Frame:
    """The plot's scale: steps to pixel columns, losses to pixel rows (padded 4% so no curve touches an edge)."""

    def __init__(self, points: Sequence[tuple[int, float]], plot_w: int, plot_h: int) -> None:
        self.plot_w, self.plot_h = plot_w, plot_h
        self.px_w, self.px_h = plot_w * 2, plot_h * 4
        self.s_min = min(s for s, _ in points)
        self.s_max = max(s for s, _ in points)
        y_min = min(v for _, v in points)
        y_max = max(v for _, v in points)
        if y_max - y_min < 1e-9:
            y_min, y_max = y_min - 0.5, y_max + 0.5
        self.pad = (y_max - y_min) * 0.04
        self.y_min, self.y_max = y_min - self.pad, y_max + self.pad
        self.decimals = label_decimals(self.y_max)

    def x_of(self, step: int) -> int:
        if self.s_max == self.s_min:
            return 0
        return round((step - self.s_min) / (self.s_max - self.s_min) * (self.px_w - 1))

    def y_of(self, v: float) -> int:
        return round((self.y_max - v) / (self.y_max - self.y_min) * (self.px_h - 1))

    def label(self, row: int) -> float | None:
        """The y value a row is labelled with: the top, the bottom and (when there is room) the middle."""
        if row == 0:
            return self.y_max - self.pad
        if row == self.plot_h - 1:
            return self.y_min + self.pad
        if row == self.plot_h // 2 and self.plot_h >= 5:
            return (self.y_max + self.y_min) / 2
        return None


class LossChart(Widget):
    """Set `series` ({rank: [(step, loss), ...]}) with `set_series`; `smoothed` draws the EMA instead."""

    DEFAULT_CSS = """
    LossChart { height: 1fr; min-height: 5; padding: 0 1 0 0; }
    """

    def __init__(self, alpha: float = 0.1, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.series: dict[int, list[tuple[int, float]]] = {}
        self.smoothed = False
        self.alpha = alpha
        self.title = "loss"
        self.empty_text = "waiting for the first logged step…"  # shown until a point arrives
        self.eval_points: list[tuple[int, float]] = []

    def set_eval(self, points: list[tuple[int, float]]) -> None:
        """The global eval loss by step, drawn over the rank curves (never smoothed: each point is a full eval)."""
        self.eval_points = points
        self.refresh()

    def set_series(self, series: dict[int, list[tuple[int, float]]]) -> None:
        self.series = series
        self.refresh()

    def set_smoothed(self, smoothed: bool) -> None:
        self.smoothed = smoothed
        self.refresh()

    def render(self) -> Content:
        width, height = self.content_size.width, self.content_size.height
        series = {r: (smooth(p, self.alpha) if self.smoothed else [q for q in p if math.isfinite(q[1])])
                  for r, p in sorted(self.series.items())}
        eval_points = [q for q in self.eval_points if math.isfinite(q[1])]
        if eval_points:
            series[EVAL] = eval_points
        title = f"{self.title} ({'smoothed' if self.smoothed else 'raw'})"
        legend = self._legend(title, list(series))
        points = [q for pts in series.values() for q in pts]
        if width < LABEL_W + 4 or height < 3:
            return legend
        plot_w, plot_h = width - LABEL_W, height - 2
        if not points:
            lines = [legend] + [Content("")] * (plot_h // 2) + [Content(self.empty_text).stylize("$text-muted")]
            return Content("\n").join(lines)
        frame = _Frame(points, plot_w, plot_h)
        bits, owner = self._plot(series, frame)
        ranks = list(series)
        lines = [legend] + [self._row(row, bits[row], owner[row], ranks, frame) for row in range(plot_h)]
        axis_left = " " * (LABEL_W - 1) + "└"
        left, right = f"step {frame.s_min}", f"{frame.s_max}"
        gap = max(1, plot_w - len(left) - len(right))
        lines.append(Content(axis_left + left + " " * gap + right).stylize("$text-muted"))
        return Content("\n").join(lines)

    def _plot(self, series: dict[int, list[tuple[int, float]]], frame: _Frame) -> tuple[list[list[int]],
                                                                                       list[list[int]]]:
        """Braille dot bits per cell and the series that drew each cell last."""
        bits = [[0] * frame.plot_w for _ in range(frame.plot_h)]
        owner = [[-1] * frame.plot_w for _ in range(frame.plot_h)]

        def dot(x: int, y: int, k: int) -> None:
            cx, cy = x >> 1, y >> 2
            bits[cy][cx] |= _DOTS[y & 3][x & 1]
            owner[cy][cx] = k

        for k, (_, pts) in enumerate(series.items()):
            prev = None
            for step, v in _downsample(pts, frame.x_of, frame.px_w):
                cur = (frame.x_of(step), frame.y_of(v))
                if prev is None or frame.s_max == frame.s_min:
                    dot(*cur, k)
                else:
                    self._line(prev, cur, k, dot)
                prev = cur
        return bits, owner

    def _row(self, row: int, bits: list[int], owner: list[int], ranks: list[int], frame: _Frame) -> Content:
        """One plot row: its y label (first, middle and last rows) and its cells, styled by the series drawn."""
        label = frame.label(row)
        text = (f"{label:>{LABEL_W - 2}.{frame.decimals}f} ┤" if label is not None
                else " " * (LABEL_W - 1) + "│")
        spans: list[Span] = [Span(0, len(text), "$text-muted")]
        chars = []
        start = len(text)
        run_owner, run_start = -2, start
        for col, b in enumerate(bits):
            chars.append(chr(BRAILLE_BASE + b) if b else " ")
            o = owner[col] if b else -1
            if o != run_owner:
                if run_owner >= 0:
                    spans.append(Span(run_start, start + col, self._style(ranks[run_owner])))
                run_owner, run_start = o, start + col
        if run_owner >= 0:
            spans.append(Span(run_start, start + len(bits), self._style(ranks[run_owner])))
        return Content(text + "".join(chars), spans=spans)

    @staticmethod
    def _style(rank: int) -> str:
        return EVAL_STYLE if rank == EVAL else SERIES_STYLES[rank % len(SERIES_STYLES)]

    def _legend(self, title: str, ranks: list[int]) -> Content:
        parts = [Content(title).stylize("bold")]
        shown = [r for r in ranks if r != EVAL]
        if len(shown) > MAX_LEGEND:
            parts.append(Content(f"  {len(shown)} ranks"))
            shown = []
        for r in shown + [r for r in ranks if r == EVAL]:
            parts.append(Content("  "))
            parts.append(Content("━━").stylize(self._style(r)))
            parts.append(Content(" eval" if r == EVAL else f" r{r}"))
        return Content("").join(parts)

    @staticmethod
    def _line(a: tuple[int, int], b: tuple[int, int], k: int, dot) -> None:
        (x0, y0), (x1, y1) = a, b
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            dot(x0, y0, k)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy
