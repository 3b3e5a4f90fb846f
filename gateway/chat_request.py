"""Reading and checking a chat completion request body.

The body is kept as the client sent it (unknown OpenAI fields pass through
untouched); pydantic checks the parts the gateway relies on, and every
problem becomes a 400 `invalid_request_error` that names the field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from gateway.errors import InvalidRequest
from policies.protocol import orphan_tool_messages


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# Bounds the record store holds (OpenAI's own are tighter: 64-character names, 40-character call ids).
NAME_MAX = 256
ID_MAX = 256


class _Function(_Open):
    name: str = Field(min_length=1, max_length=NAME_MAX)
    arguments: str


class _ToolCall(_Open):
    id: str = Field(min_length=1, max_length=ID_MAX)
    type: Literal["function"] = "function"
    function: _Function


class _Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = Field(None, max_length=NAME_MAX)
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = Field(None, max_length=ID_MAX)


class _ChatBody(_Open):
    model: str = Field(min_length=1, max_length=NAME_MAX)
    messages: list[_Message] = Field(min_length=1)
    stream: StrictBool | None = None


@dataclass(frozen=True)
class ChatRequest:
    """A checked request: the raw body plus the fields the gateway reads."""

    body: dict[str, Any]
    model: str
    messages: list[dict[str, Any]]
    stream: bool
    wants_stream_usage: bool

    def upstream_body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The OpenAI fields to forward, with `messages` replaced by the projection."""
        out = {k: v for k, v in self.body.items() if k not in ("model", "stream", "stream_options")}
        out["messages"] = messages
        if self.stream and isinstance(self.body.get("stream_options"), dict):
            out["stream_options"] = self.body["stream_options"]
        return out


def _is_union_tag(part: Any) -> bool:
    """pydantic names the union member that failed inside `loc` (`str`, `list[...]`)."""
    return isinstance(part, str) and (part in ("str", "int", "bool", "none") or "[" in part)


def _param(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_json_body(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise InvalidRequest("the request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_json")
    return body


def parse_chat_request(raw: bytes) -> ChatRequest:
    body = parse_json_body(raw)
    try:
        checked = _ChatBody.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _param(tuple(part for part in first["loc"] if not _is_union_tag(part)))
        message = first["msg"]
        if first["type"] == "missing":
            message = "is required"
        raise InvalidRequest(f"{param}: {message}", param=param) from exc
    messages = body["messages"]
    for index, message in enumerate(checked.messages):
        if message.role == "tool":
            if not message.tool_call_id:
                param = f"messages[{index}].tool_call_id"
                raise InvalidRequest(f"{param}: a tool message needs the id of the call it answers", param=param)
    orphans = orphan_tool_messages(messages)
    if orphans:
        index, reason = orphans[0]
        param = f"messages[{index}]"
        raise InvalidRequest(f"{param}: {reason}", param=param, code="invalid_tool_message")
    options = body.get("stream_options")
    return ChatRequest(
        body=body,
        model=checked.model,
        messages=messages,
        stream=bool(checked.stream),
        wants_stream_usage=isinstance(options, dict) and bool(options.get("include_usage")),
    )
