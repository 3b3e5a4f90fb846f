"""Anthropic Messages: `POST /v1/messages` and `/v1/messages/count_tokens` in and out.

In: the body is checked (block by block: text, image, document, tool_use,
tool_result, thinking, redacted_thinking; other block types pass through) and
turned into the neutral transcript: `system` becomes a system message; each
`tool_result` block its own tool message (`is_error` kept); the other blocks of
a user turn a user message; an assistant turn keeps its blocks as they came
(thinking with its signature, byte for byte) and lists its `tool_use` blocks as
`tool_calls` too, so the assembler sees calls and answers as on every path.
`cache_control` markers are left out of the neutral transcript (they move
every turn, and a message's identity must not); the gateway places its own
(gateway/pipeline/cache_markers.py).

Out: the projection is rendered back into Anthropic's shape: a user turn is its
tool results first, then its other blocks; a compacted result is a tool
result holding the memory text; a call whose arguments were compacted gets the
compacted input. Answers and stream events are Anthropic's own.
"""
from __future__ import annotations

import json
from typing import Any, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from gateway.errors import GatewayError, InvalidRequest
from gateway.pipeline.cache_markers import place_markers
from gateway.pipeline.tool_additions import addition_message, insert_at
from gateway.wire import NeutralRequest
from gateway.wire.anthropic_context import asked_edits, check_context_management
from gateway.wire.json_body import check_count, check_text, param_path, parse_json_object
from policies.protocol import orphan_tool_messages

NAME_MAX = 256
ID_MAX = 256
# Fields the gateway reads or rewrites; everything else (the system prompt too, which is never
# changed, markers and all) is passed on as the client sent it.
_OWN_FIELDS = ("model", "messages", "stream")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Message(_Open):
    role: Literal["user", "assistant", "system"]
    content: StrictStr | list[Any]


class _Tool(_Open):
    name: StrictStr = Field(min_length=1, max_length=NAME_MAX)


class _MessagesBody(_Open):
    model: StrictStr = Field(min_length=1, max_length=NAME_MAX)
    messages: list[_Message] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    system: StrictStr | list[Any] | None = None
    stream: StrictBool | None = None
    tools: list[_Tool] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    stop_sequences: list[StrictStr] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: StrictInt | None = None
    thinking: dict[str, Any] | None = None


# A block type -> (field, required type) pairs it must hold.
_BLOCK_FIELDS: dict[str, tuple[tuple[str, type | tuple[type, ...]], ...]] = {
    "text": (("text", str),),
    "image": (("source", dict),),
    "document": (("source", dict),),
    "tool_use": (("id", str), ("name", str), ("input", dict)),
    "tool_result": (("tool_use_id", str),),
    "thinking": (("thinking", str), ("signature", str)),
    "redacted_thinking": (("data", str),),
}
_USER_ONLY = frozenset({"tool_result"})
_ASSISTANT_ONLY = frozenset({"tool_use", "thinking", "redacted_thinking"})


def _check_block(block: Any, param: str, role: str) -> None:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise InvalidRequest(f"{param}: a content block is an object with a string `type`", param=param)
    kind = block["type"]
    for field, kind_of in _BLOCK_FIELDS.get(kind, ()):
        if not isinstance(block.get(field), kind_of):
            raise InvalidRequest(f"{param}.{field}: a {kind} block needs it", param=f"{param}.{field}")
    if kind in _USER_ONLY and role != "user" or kind in _ASSISTANT_ONLY and role != "assistant":
        raise InvalidRequest(f"{param}: a {kind} block cannot be in a {role} message", param=param)
    if kind == "tool_use":
        for field in ("id", "name"):
            check_text(block[field], f"{param}.{field}")
        if len(block["id"]) > ID_MAX or len(block["name"]) > NAME_MAX:
            raise InvalidRequest(f"{param}: tool_use id and name are at most {ID_MAX} characters", param=param)
    if kind == "tool_result":
        check_text(block["tool_use_id"], f"{param}.tool_use_id")
        if len(block["tool_use_id"]) > ID_MAX:
            raise InvalidRequest(f"{param}.tool_use_id: at most {ID_MAX} characters", param=f"{param}.tool_use_id")
        content = block.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise InvalidRequest(f"{param}.content: a string or a list of blocks", param=f"{param}.content")
        for number, inner in enumerate(content if isinstance(content, list) else ()):
            _check_block(inner, f"{param}.content[{number}]", "user")
        if "is_error" in block and not isinstance(block["is_error"], bool):
            raise InvalidRequest(f"{param}.is_error: true or false", param=f"{param}.is_error")


def _without_markers(value: Any) -> Any:
    """A block (or list of blocks) without `cache_control`: markers are not part of the transcript."""
    if isinstance(value, list):
        return [_without_markers(v) for v in value]
    if isinstance(value, dict) and "cache_control" in value:
        return {k: v for k, v in value.items() if k != "cache_control"}
    return value


def _arguments(tool_input: dict[str, Any]) -> str:
    return json.dumps(tool_input, ensure_ascii=False)


def to_neutral(system: Any, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """(the neutral transcript, the Anthropic location of each neutral message, for error messages)."""
    out: list[dict[str, Any]] = []
    where: list[str] = []
    if system is not None and system != []:
        out.append({"role": "system", "content": _without_markers(system)})
        where.append("system")
    for index, message in enumerate(messages):
        content = message["content"]
        here = f"messages[{index}]"
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
            where.append(here)
            continue
        blocks = _without_markers(content)
        if message["role"] == "system":
            out.append({"role": "system", "content": blocks})
            where.append(here)
            continue
        if message["role"] == "user":
            for number, block in enumerate(blocks):
                if block["type"] == "tool_result":
                    tool = {"role": "tool", "tool_call_id": block["tool_use_id"], "content": block.get("content", "")}
                    if block.get("is_error"):
                        tool["is_error"] = True
                    out.append(tool)
                    where.append(f"{here}.content[{number}]")
            others = [b for b in blocks if b["type"] != "tool_result"]
            if others or len(others) == len(blocks):
                out.append({"role": "user", "content": others})
                where.append(here)
            continue
        neutral: dict[str, Any] = {"role": "assistant", "content": blocks}
        calls = [{"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": _arguments(b["input"])}}
                 for b in blocks if b["type"] == "tool_use"]
        if calls:
            neutral["tool_calls"] = calls
        out.append(neutral)
        where.append(here)
    return out, where


def _check(body: dict[str, Any], *, needs_max_tokens: bool) -> _MessagesBody:
    try:
        checked = _MessagesBody.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and (p in ("str", "int") or "[" in p)))
        param = param_path(loc)
        message = "is required" if first["type"] == "missing" else first["msg"]
        raise InvalidRequest(f"{param}: {message}", param=param) from exc
    if needs_max_tokens and checked.max_tokens is None:
        raise InvalidRequest("max_tokens: is required", param="max_tokens")
    check_text(checked.model, "model")
    if "context_management" in body:
        check_context_management(body["context_management"])
    if isinstance(checked.system, list):
        for number, block in enumerate(checked.system):
            _check_block(block, f"system[{number}]", "user")
    for index, message in enumerate(checked.messages):
        if isinstance(message.content, list):
            for number, block in enumerate(message.content):
                _check_block(block, f"messages[{index}].content[{number}]", message.role)
    return checked


def parse_messages_body(body: dict[str, Any], *, needs_max_tokens: bool = True) -> NeutralRequest:
    checked = _check(body, needs_max_tokens=needs_max_tokens)
    messages, where = to_neutral(body.get("system"), body["messages"])
    orphans = orphan_tool_messages(messages)
    if orphans:
        index, reason = orphans[0]
        reason = reason.replace("tool_call_id", "tool_use_id").replace("a tool message", "a tool_result block")
        raise InvalidRequest(f"{where[index]}: {reason}", param=where[index], code="invalid_tool_message")
    params = {k: v for k, v in body.items() if k not in _OWN_FIELDS}
    return NeutralRequest(model=checked.model, messages=messages, stream=bool(checked.stream), params=params,
                          context_edits=asked_edits(params))


# -- from the neutral transcript back to Anthropic's shape ----------------------

def _tool_result(message: dict[str, Any]) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message["tool_call_id"],
                             "content": message.get("content") if message.get("content") is not None else ""}
    if message.get("is_error"):
        block["is_error"] = True
    return block


def _assistant(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    calls = {c["id"]: c for c in message.get("tool_calls") or []}
    if not isinstance(content, list):  # a plain (or OpenAI-shaped) assistant message
        blocks = [{"type": "text", "text": content}] if content else []
        for call in calls.values():
            blocks.append(_tool_use(call))
        return {"role": "assistant", "content": blocks if calls else (content or "")}
    out = []
    for block in content:
        if block.get("type") == "tool_use" and block.get("id") in calls:
            block = {**block, "input": _tool_input(calls[block["id"]], block.get("input"))}
        out.append(block)
    return {"role": "assistant", "content": out}


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": _tool_input(call, {})}


def _tool_input(call: dict[str, Any], original: Any) -> Any:
    arguments = call["function"].get("arguments") or "{}"
    if isinstance(original, dict) and arguments == _arguments(original):
        return original  # unchanged: the client's object as it came
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"value": value}


Spot = tuple[int, int]  # (message index, block index) in the rendered messages


def from_neutral(messages: list[dict[str, Any]], *, top_system: bool) -> tuple[list[dict[str, Any]], list[Spot | None]]:
    """Anthropic `messages` for a projection of the neutral transcript, and where each neutral message
    landed (its block), for cache markers. `top_system`: the first neutral message is the request's
    `system` field, which is sent as the client sent it, not as a message."""
    out: list[dict[str, Any]] = []
    spots: list[Spot | None] = [None] * len(messages)
    results: list[tuple[int, dict[str, Any]]] = []  # (neutral index, tool_result block) awaiting their user turn

    def flush(content: Any = None, index: int | None = None) -> None:
        nonlocal results
        if not results and index is None:
            return
        if results:
            tail = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
            out.append({"role": "user", "content": [block for _, block in results] + tail})
            for position, (neutral, _) in enumerate(results):
                spots[neutral] = (len(out) - 1, position)
            if index is not None and tail:
                spots[index] = (len(out) - 1, len(results) + len(tail) - 1)
        else:
            out.append({"role": "user", "content": content})
            if isinstance(content, str) or content:
                spots[index] = (len(out) - 1, len(content) - 1 if isinstance(content, list) else 0)
        results = []

    for index, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content") if message.get("content") is not None else ""
        if role == "system" and index == 0 and top_system:
            continue
        if role == "tool":
            results.append((index, _tool_result(message)))
        elif role == "user":
            flush(content, index)
        elif role == "assistant":
            flush()
            out.append(_assistant(message))
            rendered = out[-1]["content"]
            if rendered:
                spots[index] = (len(out) - 1, len(rendered) - 1 if isinstance(rendered, list) else 0)
        else:  # a system message inside the conversation goes back where it was
            flush()
            out.append({"role": "system", "content": content})
            if content:
                spots[index] = (len(out) - 1, len(content) - 1 if isinstance(content, list) else 0)
    flush()
    return out, spots


# -- errors, answers, events ------------------------------------------------------------

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                500: "api_error", 502: "api_error", 503: "overloaded_error", 504: "api_error", 529: "overloaded_error"}


def error_type(error: GatewayError) -> str:
    status = error.status_code
    return _ERROR_TYPES.get(status) or ("invalid_request_error" if 400 <= status < 500 else "api_error")


def error_body(error: GatewayError) -> dict[str, Any]:
    message = error.message if not error.param or error.param in error.message else f"{error.param}: {error.message}"
    return {"type": "error", "error": {"type": error_type(error), "message": message}}


def sse(event: dict[str, Any]) -> bytes:
    """One Anthropic server-sent event: its type as the event name, the object as data."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Anthropic usage summed over answers: its four token counts (the other fields are left out)."""
    if not usage:
        return total
    out = dict(total or {})
    for key in _USAGE_KEYS:
        if isinstance(usage.get(key), int):
            out[key] = (out.get(key) or 0) + usage[key]
    return out


def run_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Anthropic usage as the run records it (Chat's shape): prompt tokens include the cached and the
    cache-written."""
    if not usage:
        return None
    fresh, read = usage.get("input_tokens") or 0, usage.get("cache_read_input_tokens") or 0
    written, output = usage.get("cache_creation_input_tokens") or 0, usage.get("output_tokens") or 0
    return {"prompt_tokens": fresh + read + written, "completion_tokens": output,
            "total_tokens": fresh + read + written + output, "prompt_tokens_details": {"cached_tokens": read},
            "cache_creation_input_tokens": written}


class AnthropicMessages:
    name = "anthropic.messages"
    upstream = "messages"
    adds_tools_midway = True
    marks_cache = True

    def parse(self, raw: bytes, max_messages: int | None = None) -> NeutralRequest:
        return parse_messages_body(check_count(parse_json_object(raw), "messages", max_messages))

    def parse_count(self, raw: bytes, max_messages: int | None = None) -> NeutralRequest:
        return parse_messages_body(check_count(parse_json_object(raw), "messages", max_messages),
                                   needs_max_tokens=False)

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return error_body(error)

    def stream_error(self, error: GatewayError) -> bytes:
        return sse(error_body(error))

    def upstream_body(self, request: NeutralRequest, messages: list[dict[str, Any]],
                      stable: Sequence[int] = (), addition: tuple[dict[str, Any], int] | None = None
                      ) -> dict[str, Any]:
        """The client's fields (its system prompt as sent) with `messages` rendered from the projection,
        and cache markers after the neutral messages `stable` (gateway/pipeline/cache_markers.py), if any.

        `addition`: a tool definition and the first neutral message the projection changes; the tool is
        added there, mid-conversation (gateway/pipeline/tool_additions.py)."""
        rendered, spots = from_neutral(messages, top_system=request.params.get("system") not in (None, []))
        if addition is not None:
            definition, first_changed = addition
            holder = next((spot[0] for spot in spots[first_changed:] if spot is not None), None)
            if holder is not None:
                at = insert_at(rendered, holder)
                rendered.insert(at, addition_message(definition))
                spots = [None if spot is None else (spot[0] + (spot[0] >= at), spot[1]) for spot in spots]
        body = {**request.params, "messages": rendered}
        return place_markers(body, spots, stable) if stable else body

    def rehydration_tool(self, name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "description": description, "input_schema": schema}

    def answer_message(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        content = body.get("content")
        if not isinstance(content, list) or not all(_is_answer_block(b) for b in content):
            return None
        return to_neutral(None, [{"role": "assistant", "content": content}])[0][0]


def _is_answer_block(block: Any) -> bool:
    """A block `to_neutral` reads as an answer's: typed, and a tool_use with its id, name and input."""
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        return False
    return block["type"] != "tool_use" or (isinstance(block.get("id"), str) and isinstance(block.get("name"), str)
                                           and isinstance(block.get("input"), dict))


ANTHROPIC_MESSAGES = AnthropicMessages()
