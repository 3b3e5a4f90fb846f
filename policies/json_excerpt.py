"""The memory of a JSON result: its outline (shape and first values, cut to the budget after whole
entries, saying how many it leaves out) and, below it,
the leaves that carry a decision, each named by its path (`items[3].status: failed`), chosen by the
same salience as a text's lines (policies/excerpts.py)."""
from __future__ import annotations

import json
import re
from typing import Any

from policies.excerpts import Kept, Line, Salience, clip, salient_lines
from policies.policy import Compaction

_BARE_KEY = re.compile(r"^[\w.\-]{1,40}$")
_BARE_VALUE = re.compile(r"^[\w@.+\-:/ ]{1,40}$")


def _json_outline(value: Any, depth: int, width: int) -> str:
    """A JSON value's shape and first values, short: simple keys and strings unquoted, nesting past
    two levels counted, lists shown by their first item."""
    if isinstance(value, dict):
        if depth >= 2:
            return f"{{{len(value)} keys}}"
        parts = [f"{k if _BARE_KEY.match(k) else json.dumps(k, ensure_ascii=False)}: "
                 f"{_json_outline(v, depth + 1, width)}" for k, v in list(value.items())[:16]]
        more = f", ...{len(value) - 16} more keys" if len(value) > 16 else ""
        return "{" + ", ".join(parts) + more + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        if depth >= 2:
            return f"[{len(value)} items]"
        first = _json_outline(value[0], depth + 1, width)
        return f"[{len(value)} items; first: {first}]" if len(value) > 1 else f"[{first}]"
    if isinstance(value, str) and _BARE_VALUE.match(value) and value == value.strip():
        return value
    rendered = json.dumps(value, ensure_ascii=False)
    return rendered if len(rendered) <= width else rendered[:width] + '..."'


def _first(entry: str, room: int, limit: int) -> str:
    """The first entry of an outline, whole if it fits `room`, else cut after the last whole nested value
    that does (`...` marks the cut), else clipped to `limit`."""
    if len(entry) <= room:
        return entry
    cut = entry.rfind(", ", 0, room)
    if cut <= 0:
        cut = entry.find(", ")
    return entry[:cut] + ", ..." if 0 < cut <= limit else clip(entry, limit)


def _top_outline(value: Any, budget: int, limit: int) -> str:
    """The outline of a JSON value within `budget` characters: a mapping's or a list's entries in order,
    whole, as many as fit (at least the first, up to `limit` characters), and how many more there are
    (`...+12`), so the count of what it leaves out at the top is exact; anything else as `_json_outline` writes it."""
    if isinstance(value, dict) and value:
        entries = ((f"{k if _BARE_KEY.match(k) else json.dumps(k, ensure_ascii=False)}: "
                    f"{_json_outline(v, 1, 60)}") for k, v in value.items())
        opening, closing = "{", "}"
    elif isinstance(value, list) and len(value) > 1:
        entries = (_json_outline(item, 1, 60) for item in value)
        opening, closing = f"[{len(value)} items: ", "]"
    else:
        return clip(_json_outline(value, 0, 60), limit)
    shown: list[str] = []
    used = len(opening) + len(closing) + 8  # room for the count of what is left out
    for entry in entries:
        if shown and used + len(entry) + 2 > budget:
            break
        shown.append(entry if shown else _first(entry, max(budget - used, 0), limit))
        used += len(shown[-1]) + 2
    rest = len(value) - len(shown)
    return opening + ", ".join(shown) + (f", ...+{rest}" if rest else "") + closing


def json_excerpt(text: str, c: Compaction, salience: Salience = Salience(),
                  window: int | None = None) -> list[Kept] | None:
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    shown = _top_outline(value, c.head_chars + c.tail_chars, c.max_line_chars)
    out = [Kept(0, shown, "outline")]
    # the values the outline does not show already
    leaves = [Line(0, f"{path}: {text}") for path, text in json_leaves(value) if text not in shown]
    picked = salient_lines(leaves, salience, c.salient_chars, window or c.max_line_chars, context=False)
    return out + [Kept(0, shown, why) for _, (why, shown) in sorted(picked.items())]


_MAX_LEAVES = 5000


def json_leaves(value: Any) -> list[tuple[str, str]]:
    """(path, text) of a JSON value's scalars, each line of a long string on its own: where the
    values that decide sit in an API's answer."""
    out: list[tuple[str, str]] = []
    stack: list[tuple[str, Any]] = [("", value)]
    while stack and len(out) < _MAX_LEAVES:
        path, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((f"{path}.{key}" if path else str(key), nested) for key, nested in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", nested) for i, nested in reversed(list(enumerate(item))))
        elif isinstance(item, str):
            out.extend((path, " ".join(line.split())) for line in item.split("\n") if line.strip())
        else:
            out.append((path, json.dumps(item)))
    return out
