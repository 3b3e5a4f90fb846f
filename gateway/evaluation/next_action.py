"""A model's next action, and whether two of them agree.

The next action of an assistant message (the neutral transcript's: `content`, `tool_calls` with
`function.name` and `function.arguments`) is either its tool calls (each a name and its arguments in
canonical JSON, so key order and spacing do not count) or a final answer (text, no calls). Two actions
agree when they make the same calls with the same arguments (in any order), or are both final answers;
their similarity is 1.0 for the same calls, the share of calls in common otherwise, and for two answers
a ratio of their texts' word sequences. Deterministic and pure: shadow comparisons
(gateway/evaluation/shadows.py) and `gateway evaluate` use it alike.
"""
from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from policies.canonical import fast_canonical_json

_WORD = re.compile(r"\w+|[^\w\s]")
_COMPARED_WORDS = 2000  # texts are compared on their first words: bounded time for any answer


@dataclass(frozen=True)
class NextAction:
    kind: str  # "tool_calls" | "answer" | "none" (no message, or one with neither text nor calls)
    calls: tuple[tuple[str, str], ...] = ()  # (tool name, canonical arguments), in the message's order
    text: str = ""


@dataclass(frozen=True)
class Agreement:
    same_action: bool
    similarity: float  # 0.0 to 1.0


def call_key(name: Any, arguments: Any) -> tuple[str, str]:
    """A call as compared: its name and its arguments in canonical JSON (a string that is not JSON as it is)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return str(name), arguments
    try:
        return str(name), fast_canonical_json(arguments)
    except (TypeError, ValueError):
        return str(name), repr(arguments)


def message_calls(message: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """The calls of an assistant message, as `call_key`s."""
    if not isinstance(message, Mapping):
        return ()
    keys = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping) and function.get("name"):
            keys.append(call_key(function["name"], function.get("arguments")))
    return tuple(keys)


def message_text(message: Mapping[str, Any] | None) -> str:
    """The text of a message's content: a string, or the text of its parts."""
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content
                       if isinstance(part, Mapping) and isinstance(part.get("text"), str))
    return ""


def next_action(message: Mapping[str, Any] | None) -> NextAction:
    calls = message_calls(message)
    if calls:
        return NextAction("tool_calls", calls, message_text(message))
    text = message_text(message)
    return NextAction("answer" if text.strip() else "none", (), text)


def compare(first: NextAction, second: NextAction) -> Agreement:
    if first.kind == "tool_calls" or second.kind == "tool_calls":
        if first.kind != second.kind:
            return Agreement(False, 0.0)
        common = sum((Counter(first.calls) & Counter(second.calls)).values())
        share = common / max(len(first.calls), len(second.calls))
        return Agreement(Counter(first.calls) == Counter(second.calls), round(share, 4))
    if first.kind != second.kind:
        return Agreement(False, 0.0)
    return Agreement(True, round(text_similarity(first.text, second.text), 4))


def text_similarity(first: str, second: str) -> float:
    """How alike two texts are, 0.0 to 1.0: difflib's ratio over their first words."""
    a, b = _words(first), _words(second)
    if not a and not b:
        return 1.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def _words(text: str) -> list[str]:
    return [word.lower() for word in _take(_WORD.finditer(text), _COMPARED_WORDS)]


def _take(matches: Iterable[re.Match[str]], limit: int) -> list[str]:
    out = []
    for match in matches:
        out.append(match.group())
        if len(out) >= limit:
            break
    return out
