"""What a client reads of an upstream failure: the provider's own short message, or ours (issue 27).

LiteLLM words a failure for the operator: its exception class, the provider adapter's name, the
provider's raw error body, sometimes a traceback with file paths and package versions, the URL it
called. A tenant gets none of that: `client_message` keeps the provider's message (its `error.message`
when the text holds the provider's JSON error, else the first line of the text without LiteLLM's
prefixes), with no traceback, file path, package version, URL, host or address in it, at most
`MAX_CHARS` long; the caller says what it is when nothing is left. The whole original text goes to the
log, with the request id (`log_upstream_error`).
"""
from __future__ import annotations

import ast
import json
import logging
import re
from typing import Any, Iterable

MAX_CHARS = 300
log = logging.getLogger("gateway.upstream")

# "litellm.BadRequestError: ", "OpenAIException - ", "AzureException NotFoundError - ", "Error code: 400 - "
_PREFIX = re.compile(r"^\s*(?:(?:(?:litellm\.)?[A-Za-z_]\w*(?:Error|Exception)\s*)+(?::|-|$)\s*|Error code:\s*\d{3}\s*(?:-|$)\s*)")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|\bFile \"")
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{}]*")
_PATH = re.compile(r"[^\s'\"]*(?:site|dist)-packages[^\s'\"]*|(?:[A-Za-z]:)?(?:[\\/][\w.@+-]+)+\.(?:py[cdiw]?|so|pyd)\b")
_HOST_PORT = re.compile(r"\b(?:localhost|\d{1,3}(?:\.\d{1,3}){3}|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+):\d{1,5}\b")
_ADDRESS = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b|\[[0-9A-Fa-f:]{3,}\]")
_VERSION = re.compile(r"\b(?:litellm|python|openai|httpx|aiohttp|anthropic|pydantic)\s*(?:==|v|/|\s)\s*\d+(?:\.\d+)+\S*",
                      re.IGNORECASE)
_SPACES = re.compile(r"\s+")


def _provider_json_message(text: str) -> str | None:
    """The message of a provider's JSON error body (`{"error": {"message": ...}}`, `{"message": ...}`,
    `{"detail": ...}`), also as Python's repr of one."""
    start = text.find("{")
    if start < 0:
        return None
    candidate = text[start:text.rfind("}") + 1]
    for parse in (json.loads, ast.literal_eval):
        try:
            data = parse(candidate)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        return _message_of(data)
    return None


def _message_of(data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if isinstance(error, dict):
        return _message_of(error)
    for key in ("message", "detail", "error"):
        if isinstance(data.get(key), str) and data[key].strip():
            return data[key]
    return None


def client_message(text: str, hidden: Iterable[str] = ()) -> str:
    """The part of an upstream failure's text a client may read ("" when none is left). `hidden`: strings
    that must not appear (the deployment's api_base)."""
    text = text or ""
    while (stripped := _PREFIX.sub("", text, count=1)) != text:
        text = stripped
    text = _provider_json_message(text) or text
    text = _TRACEBACK.split(text, maxsplit=1)[0].strip().split("\n", 1)[0]
    for secret in hidden:
        if secret:
            text = text.replace(secret, "<upstream>")
    for pattern, replacement in ((_URL, "<url>"), (_PATH, "<path>"), (_HOST_PORT, "<host>"),
                                 (_ADDRESS, "<address>"), (_VERSION, "")):
        text = pattern.sub(replacement, text)
    text = _SPACES.sub(" ", text).strip(" :-")
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 3].rstrip() + "..."


def log_upstream_error(request_id: str | None, kind: str, text: str, code: str | None = None) -> None:
    """The whole text of an upstream failure, for the operator, with the run it failed and the gateway
    error code it becomes."""
    fields = {"request_id": request_id, "error_type": kind, "upstream_error": text}
    log.warning("upstream error: %s", kind, extra={"fields": fields | ({"code": code} if code else {})})
