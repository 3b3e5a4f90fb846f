"""Whether a tool result reports a failure.

OpenAI's tool messages carry no error flag, so the status is read from the
content: a JSON object with an `error` member, or text that opens like an
error report. Deterministic, so the same content always gets the same status.
"""
from __future__ import annotations

import json
import re

_ERROR_OPENING = re.compile(
    r"^\s*(?:error\b|err:|exception\b|traceback \(most recent call last\)|fatal\b|failed\b|failure\b"
    r"|permission denied|command not found|no such file or directory|\w+(?:error|exception):)",
    re.IGNORECASE,
)


def tool_result_status(text: str) -> str:
    """'error' or 'ok' for a tool result's text."""
    head = text[:2048]
    if _ERROR_OPENING.match(head):
        return "error"
    stripped = head.lstrip()
    if stripped.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            return "ok"
        if isinstance(value, dict) and value.get("error") not in (None, False, "", {}):
            return "error"
    return "ok"
