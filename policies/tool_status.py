"""Whether a tool result reports a failure.

OpenAI's tool messages carry no error flag, so the status is read from the
content: a JSON object with an `error` member, or text that opens like an
error report, is an error; a result that says it awaits approval or
confirmation is pending (unresolved). Deterministic: the same content always
gets the same status.
"""
from __future__ import annotations

import json
import re

_ERROR_OPENING = re.compile(
    r"^\s*(?:error\b|err:|exception\b|traceback \(most recent call last\)|fatal\b|failed\b|failure\b"
    r"|permission denied|command not found|no such file or directory|\w+(?:error|exception):)",
    re.IGNORECASE,
)


_PENDING = re.compile(
    r"\b(?:pending (?:approval|confirmation|review)|awaiting (?:approval|confirmation|review)"
    r"|(?:approval|confirmation) (?:is )?(?:required|pending))\b",
    re.IGNORECASE,
)


def tool_result_status(text: str) -> str:
    """'error', 'pending' (the call is not resolved yet) or 'ok' for a tool result's text."""
    head = text[:2048]
    if _ERROR_OPENING.match(head):
        return "error"
    stripped = head.lstrip()
    if stripped.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, dict):
            if value.get("error") not in (None, False, "", {}):
                return "error"
            if str(value.get("status", "")).lower() in ("pending", "awaiting_approval", "pending_approval"):
                return "pending"
    if _PENDING.search(head):
        return "pending"
    return "ok"


def message_status(message: dict, text: str) -> str:
    """A tool message's status: an explicit error flag (Anthropic's `is_error`) wins, else its text."""
    return "error" if message.get("is_error") is True else tool_result_status(text)
