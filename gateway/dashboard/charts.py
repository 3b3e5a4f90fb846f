"""Inline SVG charts for the dashboard: no script, nothing loaded from elsewhere."""
from __future__ import annotations

import math
from html import escape
from typing import Sequence

from markupsafe import Markup

WIDTH, HEIGHT, PAD_LEFT, PAD_BOTTOM, PAD_TOP = 720, 220, 64, 28, 12


def _nice_max(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten that is at least `value`."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= value * (1 - 1e-12):
            return step * magnitude
    return 10 * magnitude


def _short(value: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}".replace(".0", "")
    return f"{value:g}"


def bars(labels: Sequence[str], series: Sequence[tuple[str, str, Sequence[float]]], title: str) -> Markup:
    """Grouped bars: one group per label, one bar per (name, css colour, values) series."""
    top = _nice_max(max((v for _, _, values in series for v in values), default=0))
    plot_w, plot_h = WIDTH - PAD_LEFT - 8, HEIGHT - PAD_BOTTOM - PAD_TOP
    group_w = plot_w / max(1, len(labels))
    bar_w = max(2.0, min(28.0, group_w * 0.8 / max(1, len(series))))
    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
             f"<title>{escape(title)}</title>"]
    for i in range(5):
        y = PAD_TOP + plot_h * i / 4
        parts.append(f'<line x1="{PAD_LEFT}" x2="{WIDTH - 8}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{PAD_LEFT - 6}" y="{y + 4:.1f}" class="axis" text-anchor="end">'
                     f'{escape(_short(top * (4 - i) / 4))}</text>')
    for g, label in enumerate(labels):
        x0 = PAD_LEFT + g * group_w + (group_w - bar_w * len(series)) / 2
        for s, (name, colour, values) in enumerate(series):
            value = values[g]
            h = plot_h * value / top
            parts.append(
                f'<rect x="{x0 + s * bar_w:.1f}" y="{PAD_TOP + plot_h - h:.1f}" width="{bar_w - 1:.1f}" '
                f'height="{h:.1f}" fill="{colour}"><title>{escape(name)} {escape(label)}: {value:,.6g}</title></rect>')
        if len(labels) <= 16 or g % max(1, len(labels) // 8) == 0:
            parts.append(f'<text x="{PAD_LEFT + (g + 0.5) * group_w:.1f}" y="{HEIGHT - 8}" class="axis" '
                         f'text-anchor="middle">{escape(label[5:] if len(label) == 10 else label)}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
