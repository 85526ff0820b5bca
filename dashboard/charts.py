"""Small server-rendered SVG charts: no JavaScript, no external assets.

A chart is drawn as one step-shaped area path (cheap to send once a second:
a few kilobytes for 300 points) on a fixed 600 x 100 canvas that the page
stretches to its width. Labels live in HTML around the SVG, where they keep
their size on any screen; the only text inside the SVG is its accessible
``<title>``, escaped like everything else. Output depends only on the input,
so the same numbers always produce the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

WIDTH = 600
HEIGHT = 100
TOP_PAD = 4
"""Room above the highest value, so a full-height step is not clipped."""


@dataclass(frozen=True, slots=True)
class Chart:
    title: str
    value: str
    """The headline figure shown next to the title (the newest value)."""
    y_max: str
    """Label of the top grid line."""
    x_labels: tuple[str, ...]
    svg: SafeString
    spike: bool = False
    note: str = ""
    """A sentence under the chart: the spike explained, or why it is empty."""


def nice_ceiling(value: float, minimum: float = 1.0) -> float:
    """The smallest of 1, 2, 5 x 10^k that is >= value (and >= minimum)."""
    value = max(value, minimum)
    exponent = math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        candidate = step * 10 ** exponent
        if candidate >= value - 1e-9:
            return float(candidate)
    return float(10 ** (exponent + 1))  # pragma: no cover - the loop always returns


def _num(value: float) -> str:
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _y(value: float, y_max: float) -> float:
    return HEIGHT - (value / y_max) * (HEIGHT - TOP_PAD)


def _step_path(values: Sequence[float | None], y_max: float, start: int = 0, stop: int | None = None) -> str:
    """A closed step area for values[start:stop]; None values break it into pieces."""
    stop = len(values) if stop is None else stop
    n = len(values)
    if n == 0:
        return ""
    dx = WIDTH / n
    parts: list[str] = []
    open_segment = False
    for i in range(start, stop):
        value = values[i]
        x = i * dx
        if value is None:
            if open_segment:
                parts.append(f"V{HEIGHT}Z")
                open_segment = False
            continue
        y = _y(value, y_max)
        if not open_segment:
            parts.append(f"M{_num(x)},{HEIGHT}V{_num(y)}")
            open_segment = True
        else:
            parts.append(f"V{_num(y)}")
        parts.append(f"H{_num(x + dx)}")
    if open_segment:
        parts.append(f"V{HEIGHT}Z")
    return "".join(parts)


def _svg(title: str, body: str) -> SafeString:
    grid = "".join(
        f'<line class="grid" x1="0" x2="{WIDTH}" y1="{_num(y)}" y2="{_num(y)}" vector-effect="non-scaling-stroke"/>'
        for y in (TOP_PAD, TOP_PAD + (HEIGHT - TOP_PAD) / 2, HEIGHT)
    )
    return format_html(
        '<svg class="chart-svg" viewBox="0 0 {} {}" preserveAspectRatio="none" role="img" aria-label="{}">'
        "<title>{}</title>{}{}</svg>",
        WIDTH, HEIGHT, title, title, mark_safe(grid), mark_safe(body),
    )


def series_chart(
    values: Sequence[float | None],
    *,
    title: str,
    value: str,
    x_labels: Sequence[str],
    highlight_last: int = 0,
    spike: bool = False,
    note: str = "",
    minimum_max: float = 1.0,
) -> Chart:
    """An area chart of ``values`` (oldest first).

    With ``spike`` the last ``highlight_last`` values are drawn in the alert
    colour over a shaded band, so the eye lands on them first.
    """
    known = [v for v in values if v is not None]
    y_max = nice_ceiling(max(known, default=0.0), minimum_max)
    n = len(values)
    body: list[str] = []
    if spike and highlight_last and n:
        cut = max(0, n - highlight_last)
        x = cut * WIDTH / n
        body.append(f'<rect class="spike-band" x="{_num(x)}" y="0" width="{_num(WIDTH - x)}" height="{HEIGHT}"/>')
        body.append(f'<path class="area" d="{_step_path(values, y_max, 0, cut)}"/>')
        body.append(f'<path class="area spike" d="{_step_path(values, y_max, cut, n)}"/>')
    else:
        body.append(f'<path class="area" d="{_step_path(values, y_max)}"/>')
    return Chart(
        title=title,
        value=value,
        y_max=_num(y_max),
        x_labels=tuple(x_labels),
        svg=_svg(title, "".join(body)),
        spike=spike,
        note=note,
    )


def peaks(values: Sequence[float], bins: int) -> list[float]:
    """Down-sample to ``bins`` points keeping each bin's highest value, so no spike is averaged away."""
    n = len(values)
    if n <= bins:
        return list(values)
    out = []
    for b in range(bins):
        lo, hi = b * n // bins, (b + 1) * n // bins
        out.append(max(values[lo:hi]))
    return out
