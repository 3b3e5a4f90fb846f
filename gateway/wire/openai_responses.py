"""OpenAI Responses: `POST /v1/responses` in and out (Codex CLI, the OpenAI Agents SDK).

In: `input` (a string or items) becomes the neutral transcript. `instructions`
is the system message. A user, system or developer message item is a message.
The items the model produced between two inputs (its messages, `reasoning`
with `encrypted_content`, `function_call`, `custom_tool_call`, built-in tool
items) form one assistant turn, kept item by item as they came, with its calls
listed as `tool_calls` too; each `function_call_output` or
`custom_tool_call_output` is a tool message. So the assembler sees calls and
answers as on every path.

A `compaction` item (Codex's remote compaction: the provider's opaque summary, or the gateway's
signed reference, gateway/pipeline/compaction.py) is an assistant turn of its own, so it can be
replaced whole; a `compaction_trigger` item ends a request that asks for one, and is taken off
(`NeutralRequest.compaction`). `POST /v1/responses/compact` is the same format (`OPENAI_RESPONSES_COMPACT`).

Out: the projection is rendered back into items in the same order; a compacted
output carries the memory text; a call whose arguments were compacted gets the
compacted arguments. Answers and stream events are the Responses API's own.
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from gateway.errors import GatewayError, InvalidRequest
from gateway.wire import NeutralRequest
from gateway.wire.json_body import check_count, check_text, param_path, parse_json_object
from gateway.wire.openai_chat import error_body
from policies.protocol import orphan_tool_messages

NAME_MAX = 256
ID_MAX = 256
_OWN_FIELDS = ("model", "input", "stream", "previous_response_id")
_CALLS = {"function_call": "arguments", "custom_tool_call": "input"}
_OUTPUTS = ("function_call_output", "custom_tool_call_output")
_MESSAGE_ROLES = ("user", "system", "developer")
TRIGGER = "compaction_trigger"


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class _ResponsesBody(_Open):
    model: StrictStr = Field(min_length=1, max_length=NAME_MAX)
    input: StrictStr | list[Any]
    instructions: StrictStr | None = None
    stream: StrictBool | None = None
    store: StrictBool | None = None
    previous_response_id: StrictStr | None = Field(None, max_length=ID_MAX)
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    include: list[StrictStr] | None = None
    metadata: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)


def _kind(item: dict[str, Any]) -> str:
    return str(item.get("type") or ("message" if "role" in item else ""))


def _check_item(item: Any, param: str) -> None:
    if not isinstance(item, dict) or not isinstance(item.get("type", "message"), str) or not _kind(item):
        raise InvalidRequest(f"{param}: an input item is an object with a `type` (or a message's `role`)",
                             param=param)
    kind = _kind(item)
    if kind == "message":
        if item.get("role") not in ("user", "system", "developer", "assistant"):
            raise InvalidRequest(f"{param}.role: user, system, developer or assistant", param=f"{param}.role")
        content = item.get("content")
        if not isinstance(content, (str, list)):
            raise InvalidRequest(f"{param}.content: a string or a list of parts", param=f"{param}.content")
        for number, part in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise InvalidRequest(f"{param}.content[{number}]: a part is an object with a string `type`",
                                     param=f"{param}.content[{number}]")
            if part["type"] in ("input_text", "output_text") and not isinstance(part.get("text"), str):
                raise InvalidRequest(f"{param}.content[{number}].text: a string", param=f"{param}.content[{number}].text")
    elif kind == "compaction":
        if not isinstance(item.get("encrypted_content"), str):
            raise InvalidRequest(f"{param}.encrypted_content: a string", param=f"{param}.encrypted_content")
    elif kind == TRIGGER:
        raise InvalidRequest(f"{param}: a compaction_trigger item ends the input", param=param)
    elif kind in _CALLS or kind in _OUTPUTS:
        for field in ("call_id",) + (("name", _CALLS[kind]) if kind in _CALLS else ()):
            if not isinstance(item.get(field), str):
                raise InvalidRequest(f"{param}.{field}: a string", param=f"{param}.{field}")
        check_text(item["call_id"], f"{param}.call_id")
        if len(item["call_id"]) > ID_MAX:
            raise InvalidRequest(f"{param}.call_id: at most {ID_MAX} characters", param=f"{param}.call_id")
        if kind in _CALLS:
            check_text(item["name"], f"{param}.name")
            if not item["name"] or len(item["name"]) > NAME_MAX:
                raise InvalidRequest(f"{param}.name: 1 to {NAME_MAX} characters", param=f"{param}.name")
            check_text(item[_CALLS[kind]], f"{param}.{_CALLS[kind]}")
        elif not isinstance(item.get("output"), (str, list)):
            raise InvalidRequest(f"{param}.output: a string or a list of parts", param=f"{param}.output")


def _without(item: dict[str, Any], field: str) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k != field}


def to_neutral(instructions: str | None, items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """(the neutral transcript, the location of each neutral message in the request, for errors)."""
    out: list[dict[str, Any]] = []
    where: list[str] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
        where.append("instructions")
    turn: dict[str, Any] | None = None

    def close() -> None:
        nonlocal turn
        if turn is not None:
            if not turn["tool_calls"]:
                del turn["tool_calls"]
            out.append(turn)
            turn = None

    for index, item in enumerate(items):
        kind = _kind(item)
        here = f"input[{index}]"
        if kind == "message" and item.get("role") in _MESSAGE_ROLES:
            close()
            out.append({"role": item["role"], "content": item.get("content"), "responses_item": _without(item, "content")})
            where.append(here)
        elif kind in _OUTPUTS:
            close()
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item.get("output"),
                        "responses_item": _without(item, "output")})
            where.append(here)
        elif kind == "compaction":  # stands for the turns it compacted: a turn of its own
            close()
            out.append({"role": "assistant", "content": [item]})
            where.append(here)
        else:  # something the model produced: part of its turn
            if turn is None:
                turn = {"role": "assistant", "content": [], "tool_calls": []}
                where.append(here)
            turn["content"].append(item)
            if kind in _CALLS:
                turn["tool_calls"].append({"id": item["call_id"], "type": "function",
                                           "function": {"name": item["name"], "arguments": item[_CALLS[kind]]}})
    close()
    return out, where


def _items(value: str | list[Any]) -> list[Any]:
    return [{"type": "message", "role": "user", "content": value}] if isinstance(value, str) else value


def parse_responses_body(body: dict[str, Any]) -> NeutralRequest:
    try:
        checked = _ResponsesBody.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and (p in ("str", "int") or "[" in p)))
        param = param_path(loc)
        raise InvalidRequest(f"{param}: {'is required' if first['type'] == 'missing' else first['msg']}",
                             param=param) from exc
    check_text(checked.model, "model")
    if checked.previous_response_id is not None:
        check_text(checked.previous_response_id, "previous_response_id")
    items = _items(checked.input)
    trigger = bool(items) and isinstance(items[-1], dict) and items[-1].get("type") == TRIGGER
    if trigger:
        items = items[:-1]
    for index, item in enumerate(items):
        _check_item(item, f"input[{index}]")
    messages, where = to_neutral(checked.instructions, items)
    if checked.previous_response_id is None:
        _check_pairs(messages, where)
    return NeutralRequest(
        model=checked.model,
        messages=messages,
        stream=bool(checked.stream),
        params={k: v for k, v in body.items() if k not in _OWN_FIELDS},
        previous_response_id=checked.previous_response_id,
        compaction="responses" if trigger else None,
    )


def _check_pairs(messages: list[dict[str, Any]], where: list[str]) -> None:
    orphans = orphan_tool_messages(messages)
    if orphans:
        index, reason = orphans[0]
        reason = reason.replace("tool_call_id", "call_id").replace("a tool message", "a call's output")
        raise InvalidRequest(f"{where[index]}: {reason}", param=where[index], code="invalid_tool_message")


def check_pairs(messages: list[dict[str, Any]]) -> None:
    """The transcript a `previous_response_id` continues, joined to the new input, checked whole."""
    _check_pairs(messages, ["input"] * len(messages))


# -- from the neutral transcript back to items ------------------------------------------------

def _assistant_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    calls = {c["id"]: c for c in message.get("tool_calls") or []}
    if not isinstance(content, list):  # a plain assistant message (an answer the gateway stored)
        items: list[dict[str, Any]] = []
        if content:
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": content, "annotations": []}]})
        for call in calls.values():
            items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                          "arguments": call["function"].get("arguments") or ""})
        return items
    out = []
    for item in content:
        kind = _kind(item)
        if kind in _CALLS and item.get("call_id") in calls:
            item = {**item, _CALLS[kind]: calls[item["call_id"]]["function"].get("arguments") or ""}
        out.append(item)
    return out


def from_neutral(messages: list[dict[str, Any]], *, top_instructions: bool) -> list[dict[str, Any]]:
    """The `input` items for a projection of the neutral transcript."""
    items: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "system" and index == 0 and top_instructions:
            continue  # sent as the request's `instructions`, as the client sent it
        if role == "tool":
            base = message.get("responses_item") or {"type": "function_call_output"}
            items.append({**base, "call_id": message["tool_call_id"], "output": message.get("content") or ""})
        elif role == "assistant":
            items += _assistant_items(message)
        else:
            base = message.get("responses_item") or {"type": "message", "role": role}
            items.append({**base, "content": message.get("content")})
    return items


def output_to_neutral(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the assistant turn of the neutral transcript."""
    messages, _ = to_neutral(None, [item for item in output if _kind(item) != "message"
                                    or item.get("role", "assistant") == "assistant"])
    return messages


def sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def error_event(error: GatewayError) -> dict[str, Any]:
    """The `error` event that ends a Responses stream (the relay numbers it in sequence)."""
    return {"type": "error", "code": error.code, "message": error.message, "param": error.param}


def response_id_for(request_id: str) -> str:
    """The id of the response the gateway answers a request with: `resp_` and the request id's hex, which
    `previous_response_id` and `GET /v1/responses/{id}` resolve."""
    return f"resp_{request_id.removeprefix('req_')}"


def request_id_for(response_id: str) -> str | None:
    hexa = response_id.removeprefix("resp_")
    return f"req_{hexa}" if response_id.startswith("resp_") and len(hexa) == 32 else None


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Responses usage summed over answers: input, output and total tokens, and cached input tokens."""
    if not usage:
        return total
    out = dict(total or {})
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        out[key] = (out.get(key) or 0) + (usage.get(key) or 0)
    cached = ((out.get("input_tokens_details") or {}).get("cached_tokens") or 0) + (
        (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    out["input_tokens_details"] = {**(out.get("input_tokens_details") or {}), "cached_tokens": cached}
    return out


def run_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Responses usage as the run records it (Chat's shape)."""
    if not usage:
        return None
    return {"prompt_tokens": usage.get("input_tokens") or 0, "completion_tokens": usage.get("output_tokens") or 0,
            "total_tokens": usage.get("total_tokens") or 0,
            "prompt_tokens_details": {"cached_tokens": (usage.get("input_tokens_details") or {}).get("cached_tokens")}}


class OpenAIResponses:
    name = "openai.responses"
    upstream = "responses"
    adds_tools_midway = False
    marks_cache = False

    def parse(self, raw: bytes, max_messages: int | None = None) -> NeutralRequest:
        return parse_responses_body(check_count(parse_json_object(raw), "input", max_messages))

    def upstream_body(self, request: NeutralRequest, messages: list[dict[str, Any]],
                      stable: Sequence[int] = (), addition: tuple[dict[str, Any], int] | None = None
                      ) -> dict[str, Any]:
        if addition is not None:
            raise ValueError(f"{self.name} declares tools in `tools` only (adds_tools_midway is False)")
        body = {k: v for k, v in request.params.items() if k != "store"}
        body["input"] = from_neutral(messages, top_instructions=bool(request.params.get("instructions")))
        body["store"] = False  # the gateway holds the transcript; the provider needs none of it
        return body

    def rehydration_tool(self, name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "name": name, "description": description, "parameters": schema}

    def answer_message(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        output = body.get("output")
        if not isinstance(output, list) or not all(isinstance(item, dict) for item in output):
            return None
        try:
            messages = output_to_neutral(output)
        except (KeyError, TypeError):  # a call item without its call_id, name or arguments
            return None
        return next((m for m in messages if m.get("role") == "assistant"), None)

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return error_body(error)

    def stream_error(self, error: GatewayError) -> bytes:
        return sse(error_event(error))


OPENAI_RESPONSES = OpenAIResponses()


class OpenAIResponsesCompact(OpenAIResponses):
    """`POST /v1/responses/compact`: `model`, `input` (or `previous_response_id`) and `instructions`; answered
    whole (a `response.compaction` object), never streamed."""

    def parse(self, raw: bytes, max_messages: int | None = None) -> NeutralRequest:
        body = check_count(parse_json_object(raw), "input", max_messages)
        if "input" not in body:
            if body.get("previous_response_id") is None:
                raise InvalidRequest("input: is required (or previous_response_id)", param="input")
            body = {**body, "input": []}
        neutral = parse_responses_body({k: v for k, v in body.items() if k != "stream"})
        return replace(neutral, compaction="responses/compact")


OPENAI_RESPONSES_COMPACT = OpenAIResponsesCompact()
