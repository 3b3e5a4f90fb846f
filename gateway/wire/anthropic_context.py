"""Anthropic's context management (`context_management`, beta `context-management-2025-06-27`): the
request field checked, and the provider's edits read.

A client (Claude Code sends `clear_thinking_20251015` whenever thinking is on) asks the provider to
edit the prompt server-side before the model reads it: `clear_tool_uses_20250919` replaces old tool
results with a placeholder once the prompt passes a trigger, `clear_thinking_20251015` drops old
thinking blocks. The field is forwarded as the client sent it; here it is only checked for the shape
Anthropic documents (so a malformed one is a 400 naming the field, in Anthropic's error shape, before
anything is captured), with edit types the gateway does not know passed on unchecked. The provider
reports what it did as `context_management.applied_edits` on the message (on a stream's
`message_delta`); the run records both (`storage/assembly_record.py`).

The projection does not change for it. Clearing tool results on top of the gateway's memories can
change the cached prefix twice (the gateway's epoch move, then the provider's clearing of a batch of
memories, which free little), but leaving the results to the provider costs more: with
`bench/format_replay.py --context-management` (Claude Code's edits scaled to the traces), the
gateway's replay costs 0.69 of the client's own over every trace (at most 1.00 on one), and the
provider cleared on top of the projection once in 13 traces; with the gateway's epochs off for such
requests it cost 0.95 (up to 1.45), and with its kept rounds and batch sizes raised to the edit's
1.05 (up to 1.26; these two measured before the distinctive excerpts, when both acting cost 0.68).
"""
from __future__ import annotations

from typing import Any, Mapping

from gateway.errors import InvalidRequest

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
_MAX_EDITS = 16
_MAX_NAMES = 1024


def _fail(param: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {what}", param=param)


def _count(value: Any, param: str, kinds: tuple[str, ...]) -> None:
    """A `{type, value}` threshold: `type` one of `kinds`, `value` a whole number >= 0."""
    if not isinstance(value, dict):
        raise _fail(param, "an object with `type` and `value`")
    if value.get("type") not in kinds:
        raise _fail(f"{param}.type", f"one of {', '.join(kinds)}")
    number = value.get("value")
    if type(number) is not int or number < 0:
        raise _fail(f"{param}.value", "a whole number, 0 or more")


def _names(value: Any, param: str) -> None:
    if not isinstance(value, list) or len(value) > _MAX_NAMES or not all(isinstance(n, str) for n in value):
        raise _fail(param, f"a list of at most {_MAX_NAMES} tool names")


def _clear_tool_uses(edit: dict[str, Any], param: str) -> None:
    if edit.get("trigger") is not None:
        _count(edit["trigger"], f"{param}.trigger", ("input_tokens", "tool_uses"))
    if edit.get("keep") is not None:
        _count(edit["keep"], f"{param}.keep", ("tool_uses",))
    if edit.get("clear_at_least") is not None:
        _count(edit["clear_at_least"], f"{param}.clear_at_least", ("input_tokens",))
    if edit.get("exclude_tools") is not None:
        _names(edit["exclude_tools"], f"{param}.exclude_tools")
    inputs = edit.get("clear_tool_inputs")
    if inputs is not None and not isinstance(inputs, bool):
        _names(inputs, f"{param}.clear_tool_inputs")


def _clear_thinking(edit: dict[str, Any], param: str) -> None:
    keep = edit.get("keep")
    if keep is None or keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all" and len(keep) == 1):
        return
    _count(keep, f"{param}.keep", ("thinking_turns",))


def check_context_management(value: Any) -> None:
    """An InvalidRequest naming the part of `context_management` that is not of Anthropic's shape."""
    if not isinstance(value, dict):
        raise _fail("context_management", "an object")
    edits = value.get("edits")
    if edits is None:
        return
    if not isinstance(edits, list) or len(edits) > _MAX_EDITS:
        raise _fail("context_management.edits", f"a list of at most {_MAX_EDITS} edits")
    for index, edit in enumerate(edits):
        param = f"context_management.edits[{index}]"
        if not isinstance(edit, dict) or not isinstance(edit.get("type"), str) or not edit["type"]:
            raise _fail(param, "an object with a string `type`")
        if edit["type"] == CLEAR_TOOL_USES:
            _clear_tool_uses(edit, param)
        elif edit["type"] == CLEAR_THINKING:
            _clear_thinking(edit, param)


def asked_edits(params: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The edits a checked request asks of the provider (None: it asks for no context management)."""
    value = params.get("context_management")
    if not isinstance(value, dict):
        return None
    return list(value.get("edits") or [])


def applied_edits(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The edits an answer (a message, or a stream's `message_delta`) says the provider applied; None
    when it says nothing of context management."""
    managed = body.get("context_management")
    if not isinstance(managed, dict) or not isinstance(managed.get("applied_edits"), list):
        return None
    return [e for e in managed["applied_edits"] if isinstance(e, dict)]
