"""How the dashboard's evaluation page says the report's figures: units, intervals, verdicts in words.

The figures are `evaluation_report`'s (gateway/evaluation/report.py, the same function `GET /api/evaluation`
serves), never recomputed here; this module only formats them. A signal's unit is read from its name (a
`_share` is a percentage, `cost_` is USD, `tokens_` a token count, the rest a rate), so a signal added to
the report shows with a sensible unit without a change here. Each verdict has a sentence saying what it
means for the agents, shown beside its badge; the shadow comparisons' verdict has its own sentences.
"""
from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from markupsafe import Markup

VERDICTS = {
    "better": "The projection helps: the whole 95% interval of the difference is on the good side ({good} is "
              "better).",
    "worse": "The projection hurts: the whole 95% interval of the difference is on the bad side ({good} is "
             "better).",
    "no_difference": "No measurable effect: the 95% interval of the difference includes zero.",
    "insufficient_data": "Too little data to judge: an arm has fewer than {minimum} conversations, or nothing to "
                         "measure this by yet.",
}
LEGEND = (
    ("better", "the agents do measurably better with the projection than without it."),
    ("worse", "the agents do measurably worse with the projection than without it."),
    ("no_difference", "no effect beyond chance; an effect smaller than the interval's width may remain."),
    ("insufficient_data", "fewer than {minimum} conversations in an arm: no verdict yet."),
)
SHADOW_VERDICTS = {
    "worse": "The model's next action with the projection differs from its next action on the transcript as "
             "sent more often than chance allows (the disagreement's 95% interval excludes zero).",
    "no_difference": "With and without the projection the model took the same next action, within chance.",
    "insufficient_data": "Fewer than {minimum} shadow comparisons so far: too few to judge.",
}
ARM_NAMES = {"projected": "Projected", "holdout": "Held out"}
ARM_NOTES = {"projected": "forwarded as the gateway's projection", "holdout": "forwarded as the client sent them"}


def unit(signal: str) -> str:
    """`share`, `usd`, `tokens` or `rate`, from the signal's name."""
    if signal.endswith("_share"):
        return "share"
    if signal.startswith("cost_"):
        return "usd"
    if signal.startswith(("tokens_", "cached_tokens")):
        return "tokens"
    return "rate"


def figure(value: float | None, signal: str, signed: bool = False) -> str:
    """A rate or a difference in the signal's unit; `–` when there is none."""
    if value is None:
        return "–"
    kind = unit(signal)
    sign = "+" if signed and value > 0 else ""
    if kind == "share":
        return f"{sign}{value * 100:.1f}{' pp' if signed else '%'}"
    if kind == "usd":
        return f"{sign}{'-' if value < 0 else ''}${abs(value):,.6f}"
    if kind == "tokens":
        return f"{sign}{value:,.1f}"
    return f"{sign}{value:.3f}"


def interval(bounds: list[float] | None, signal: str, signed: bool = False) -> str:
    """A 95% interval as `[low, high]` in the signal's unit; empty when there is none."""
    if not bounds:
        return ""
    return f"[{figure(bounds[0], signal, signed)}, {figure(bounds[1], signal, signed)}]"


def verdict_words(signal: Mapping[str, Any], minimum: int) -> str:
    return VERDICTS[signal["verdict"]].format(good=signal["better_when"], minimum=minimum)


def shadow_words(shadow: Mapping[str, Any], minimum: int) -> str:
    return SHADOW_VERDICTS[shadow["verdict"]].format(minimum=minimum)


def share(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def difference_mark(difference: Mapping[str, Any] | None, verdict: str) -> Markup:
    """The difference and its interval against zero, as a small inline SVG (no script, no inline style):
    a line from the interval's low to its high, a dot at the difference, zero as a vertical rule."""
    width, height, pad = 140, 16, 6
    parts = [(f'<svg class="mark v-{escape(verdict)}" viewBox="0 0 {width} {height}" width="{width}" '
              f'height="{height}" role="img" aria-label="difference and its 95% interval against zero">'),
             f'<line class="zero" x1="{width / 2}" x2="{width / 2}" y1="1" y2="{height - 1}"/>']
    if difference is not None and difference.get("interval"):
        low, high = difference["interval"]
        reach = max(abs(low), abs(high), abs(difference["value"])) * 1.1 or 1.0

        def x(value: float) -> float:
            return width / 2 + (width / 2 - pad) * value / reach

        parts.append(f'<line class="span" x1="{x(low):.1f}" x2="{x(high):.1f}" y1="{height / 2}" y2="{height / 2}"/>')
        parts.append(f'<circle class="dot" cx="{x(difference["value"]):.1f}" cy="{height / 2}" r="3"/>')
    parts.append("</svg>")
    return Markup("".join(parts))


def arm_name(arm: str) -> str:
    return ARM_NAMES.get(arm, arm)


def arm_note(arm: str) -> str:
    return ARM_NOTES.get(arm, "")


FILTERS = {"figure": figure, "interval": interval, "share": share, "arm_name": arm_name, "arm_note": arm_note}
GLOBALS = {"verdict_legend": LEGEND, "verdict_words": verdict_words, "shadow_words": shadow_words, "difference_mark": difference_mark}
