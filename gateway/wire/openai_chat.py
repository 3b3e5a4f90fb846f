"""OpenAI Chat Completions: `POST /v1/chat/completions` in and out.

The body is kept as the client sent it (unknown OpenAI fields pass through
untouched); pydantic checks the parts the gateway relies on, the content parts
are checked by type, and every problem becomes a 400 `invalid_request_error`
that names the field. The neutral transcript is this format's own messages, so
answers go back unchanged.
"""
from __future__ import annotations

import json
from typing import Any, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from gateway.errors import GatewayError, InvalidRequest
from gateway.wire import NeutralRequest
from gateway.wire.json_body import (
    check_count, check_text, param_path, parse_json_object, parse_json_object_but, plain_item,
)
from gateway.wire.body_layouts import BodyLayouts, Laid
from gateway.wire.seen_messages import MIN_MESSAGES, SeenMessages, message_digests
from policies.protocol import orphan_tool_messages

# Bounds the record store holds (OpenAI's own are tighter: 64-character names, 40-character call ids).
NAME_MAX = 256
ID_MAX = 256
SSE_DONE = b"data: [DONE]\n\n"


class _Open(BaseModel):
    # Unknown fields are the client's to send: the body goes on as sent, so the models only check
    # (and do not keep copies of what they do not name).
    model_config = ConfigDict(extra="ignore")


class _Function(_Open):
    name: StrictStr = Field(min_length=1, max_length=NAME_MAX)
    arguments: StrictStr


class _ToolCall(_Open):
    id: StrictStr = Field(min_length=1, max_length=ID_MAX)
    type: Literal["function"] = "function"
    function: _Function


class _Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[Any] | None = None  # parts are checked one by one, by type
    name: StrictStr | None = Field(None, max_length=NAME_MAX)
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: StrictStr | None = Field(None, max_length=ID_MAX)


class _ToolFunction(_Open):
    name: StrictStr = Field(min_length=1, max_length=NAME_MAX)


class _Tool(_Open):
    type: StrictStr
    function: _ToolFunction | None = None


class _ChatBody(_Open):
    model: StrictStr = Field(min_length=1, max_length=NAME_MAX)
    messages: list[_Message] = Field(min_length=1)
    stream: StrictBool | None = None
    stream_options: dict[str, Any] | None = None
    tools: list[_Tool] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    n: int | None = Field(None, ge=1, le=128)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    temperature: float | None = None
    top_p: float | None = None
    stop: StrictStr | list[StrictStr] | None = None
    response_format: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    user: StrictStr | None = None


# A content part's type -> the field that must hold a string (None: an object is enough).
_TEXT_FIELDS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
_OBJECT_FIELDS = {"input_audio": "input_audio", "file": "file"}


def _check_part(part: Any, param: str) -> None:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise InvalidRequest(f"{param}: a content part is an object with a string `type`", param=param)
    kind = part["type"]
    if kind in _TEXT_FIELDS and not isinstance(part.get(_TEXT_FIELDS[kind]), str):
        field = f"{param}.{_TEXT_FIELDS[kind]}"
        raise InvalidRequest(f"{field}: a {kind} part needs a string `{_TEXT_FIELDS[kind]}`", param=field)
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise InvalidRequest(f"{param}.image_url: an image_url part needs a string url", param=f"{param}.image_url")
    if kind in _OBJECT_FIELDS and not isinstance(part.get(_OBJECT_FIELDS[kind]), dict):
        field = f"{param}.{_OBJECT_FIELDS[kind]}"
        raise InvalidRequest(f"{field}: a {kind} part needs an object", param=field)


def _is_union_tag(part: Any) -> bool:
    """pydantic names the union member that failed inside `loc` (`str`, `list[...]`)."""
    return isinstance(part, str) and (part in ("str", "int", "bool", "none", "float") or "[" in part)


def _check_messages(checked: _ChatBody, messages: list[dict[str, Any]], indices: Sequence[int],
                    prefix_checked: int = 0) -> None:
    """The checks of each message pydantic validated (at `indices`), then of the transcript as a whole
    (its first `prefix_checked` messages passed them before, as the transcript of a body of their own)."""
    for index, message in zip(indices, checked.messages):
        where = f"messages[{index}]"
        if isinstance(message.content, list):
            for number, part in enumerate(message.content):
                _check_part(part, f"{where}.content[{number}]")
        if message.role == "tool" and not message.tool_call_id:
            raise InvalidRequest(f"{where}.tool_call_id: a tool message needs the id of the call it answers",
                                 param=f"{where}.tool_call_id")
        for field in ("name", "tool_call_id"):
            value = getattr(message, field)
            if value is not None:
                check_text(value, f"{where}.{field}")
        for number, call in enumerate(message.tool_calls or []):
            check_text(call.id, f"{where}.tool_calls[{number}].id")
            check_text(call.function.name, f"{where}.tool_calls[{number}].function.name")
            check_text(call.function.arguments, f"{where}.tool_calls[{number}].function.arguments")
    orphans = orphan_tool_messages(messages, prefix_checked)
    if orphans:
        index, reason = orphans[0]
        param = f"messages[{index}]"
        raise InvalidRequest(f"{param}: {reason}", param=param, code="invalid_tool_message")


def parse_chat_body(body: dict[str, Any], unread: list[Any] | None = None,
                    raw: bytes | None = None, laid: Laid | None = None) -> NeutralRequest:
    """A parsed body checked as a chat completion request: the messages it holds that passed before
    (gateway/wire/seen_messages.py) are not checked again, and their digests go on with the request.

    `unread`: the body's messages, when `parse_json_object_but` left them unchecked (then `raw` is the
    body): those not seen before are checked here, and the body is parsed again by `parse_json_object`
    if one is not as `json.loads` reads it. A message is remembered only when orjson's reading of it was
    checked (a message read by `json.loads` may hold an integer past 64 bits that orjson reads as the
    same float it holds), so a message seen before is plain too: the same JSON, in the same place.
    `laid`: the body's layout, when the caller has it already (`OpenAIChat.parse`)."""
    messages = body.get("messages")
    digests: list[bytes | None] | None = None
    indices: Sequence[int] = range(len(messages)) if isinstance(messages, list) else ()
    validated = body
    if isinstance(messages, list) and len(messages) >= MIN_MESSAGES:
        # A body orjson read whole: the digests of the messages it shares with a recent body's bytes are that body's.
        if unread is not None and raw is not None:
            laid = laid or _LAYOUTS.lay_out(raw, body)
            digests = laid.digests
        else:
            digests = message_digests(messages)
        unseen = _SEEN.unseen(digests) or [len(messages) - 1]  # the body's schema wants one message
        if len(unseen) < len(messages):
            indices = unseen
            validated = {**body, "messages": [messages[i] for i in unseen]}
    if unread is not None and not all(plain_item(unread[i]) for i in indices):  # the messages checked below
        return parse_chat_body(parse_json_object(raw or b""))
    try:
        checked = _ChatBody.model_validate(validated)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first["loc"]
        if len(loc) > 1 and loc[0] == "messages" and isinstance(loc[1], int) and loc[1] < len(indices):
            loc = ("messages", indices[loc[1]], *loc[2:])  # where it is in the client's transcript
        param = param_path(tuple(part for part in loc if not _is_union_tag(part)))
        message = "is required" if first["type"] == "missing" else first["msg"]
        raise InvalidRequest(f"{param}: {message}", param=param) from exc
    check_text(checked.model, "model")
    for index, tool in enumerate(checked.tools or []):
        if tool.type == "function" and tool.function is None:
            raise InvalidRequest(f"tools[{index}].function: is required for a function tool",
                                 param=f"tools[{index}].function")
    messages = body["messages"]
    _check_messages(checked, messages, indices, laid.checked if laid is not None else 0)
    if digests is not None and unread is not None:
        _SEEN.passed(digests, indices)
    if laid is not None:
        _LAYOUTS.passed(laid, messages)
    options = body.get("stream_options")
    return NeutralRequest(
        model=checked.model,
        messages=messages,
        stream=bool(checked.stream),
        params={k: v for k, v in body.items() if k not in ("model", "messages", "stream")},
        wants_stream_usage=isinstance(options, dict) and bool(options.get("include_usage")),
        digests=digests,
    )


_LAYOUTS = BodyLayouts()  # where the messages of recent bodies end (gateway/wire/body_layouts.py)
_SEEN = SeenMessages()  # chat messages that passed `_ChatBody` and `_check_messages`'s per-message checks


def sse_event(payload: Any) -> bytes:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def error_body(error: GatewayError) -> dict[str, Any]:
    return {"error": {"message": error.message, "type": error.error_type, "param": error.param, "code": error.code}}


_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens", "cache_creation_input_tokens")


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat usage summed over answers (a request's hidden rounds): the token counts and the cached tokens
    added, the other fields the first answer's. Chat's shape is also how a run records usage."""
    if not usage:
        return total
    if total is None:
        return {**usage}
    out = {**total}
    for key in _USAGE_FIELDS:
        if key in total or key in usage:
            out[key] = (out.get(key) or 0) + (usage.get(key) or 0)
    cached = ((total.get("prompt_tokens_details") or {}).get("cached_tokens") or 0) + (
        (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    out["prompt_tokens_details"] = {**(total.get("prompt_tokens_details") or {}), "cached_tokens": cached}
    return out


class OpenAIChat:
    name = "openai.chat"
    upstream = "chat"
    adds_tools_midway = False
    marks_cache = False

    def parse(self, raw: bytes, max_messages: int | None = None) -> NeutralRequest:
        """The body checked; its messages that a recent body shares are that body's objects, not parsed
        again (gateway/wire/body_layouts.py `spliced`), once its layout shows the splice is the parse."""
        spliced = _LAYOUTS.spliced(raw)
        if spliced is not None:
            body, unread, based = spliced
            laid = _LAYOUTS.lay_out(raw, body, based)
            if laid.layout is not None:
                return parse_chat_body(check_count(body, "messages", max_messages), unread, raw, laid)
        body, unread = parse_json_object_but(raw, "messages")
        return parse_chat_body(check_count(body, "messages", max_messages), unread, raw)

    def upstream_body(self, request: NeutralRequest, messages: list[dict[str, Any]],
                      stable: Sequence[int] = (), addition: tuple[dict[str, Any], int] | None = None
                      ) -> dict[str, Any]:
        if addition is not None:
            raise ValueError(f"{self.name} declares tools in `tools` only (adds_tools_midway is False)")
        out = {k: v for k, v in request.params.items() if k != "stream_options" or request.stream}
        out["messages"] = messages
        return out

    def rehydration_tool(self, name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}

    def answer_message(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        choices = body.get("choices")
        message = choices[0].get("message") if isinstance(choices, list) and choices \
            and isinstance(choices[0], dict) else None
        return {**message, "role": "assistant"} if isinstance(message, dict) else None

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return error_body(error)

    def stream_error(self, error: GatewayError) -> bytes:
        return sse_event(error_body(error))  # and no [DONE]: the stream did not complete


OPENAI_CHAT = OpenAIChat()
