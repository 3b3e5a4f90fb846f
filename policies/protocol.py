"""What makes a transcript a valid chat request for a provider."""
from __future__ import annotations

from typing import Any, Mapping, Sequence


def orphan_tool_messages(messages: Sequence[Mapping[str, Any]], checked: int = 0) -> list[tuple[int, str]]:
    """Tool messages that answer no call of the assistant message they follow.

    Returns (index, reason) pairs. A tool message must come after an assistant
    message with `tool_calls` (other tool messages may sit between them) and
    name one of its call ids, at most once. `checked`: the first messages are
    known to have none (they were checked as a transcript of their own; what a
    message is found to be depends only on what precedes it): the walk starts
    at the last of them that is no tool message.
    """
    problems: list[tuple[int, str]] = []
    open_calls: set[str] | None = None
    answered: set[str] = set()
    begin = min(checked, len(messages)) - 1
    while begin > 0 and messages[begin].get("role") == "tool":
        begin -= 1
    begin = max(begin, 0)
    for index, message in enumerate(messages[begin:] if begin else messages, begin):
        role = message.get("role")
        if role == "assistant":
            open_calls = {c.get("id") for c in message.get("tool_calls") or []}
            answered = set()
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not open_calls:
                problems.append((index, "a tool message must follow an assistant message with tool_calls"))
            elif call_id not in open_calls:
                problems.append((index, f"tool_call_id {call_id!r} answers no call of the preceding assistant message"))
            elif call_id in answered:
                problems.append((index, f"tool_call_id {call_id!r} is answered twice"))
            else:
                answered.add(call_id)
        else:
            open_calls = None
    return problems


def ends_on_answered_round(messages: Sequence[Mapping[str, Any]]) -> bool:
    """True when the last message is a tool result and no call of the last assistant turn is open:
    where an agent's request ends (the benchmarks cut transcripts back to such a place)."""
    if not messages or messages[-1].get("role") != "tool":
        return False
    last = max(i for i, m in enumerate(messages) if m.get("role") == "assistant")
    asked = {c["id"] for c in messages[last].get("tool_calls") or []}
    return asked <= {m.get("tool_call_id") for m in messages[last + 1:]}
