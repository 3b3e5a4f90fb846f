"""Google's Gemini API (`generateContent`, `streamGenerateContent`, `countTokens`) in and out.

The model and the call come from the path (`/v1beta/models/{model}:{method}`), so a
request is parsed by a `GeminiCall` made for it (`GEMINI.call(model, stream, sse)`).

In: `contents` is checked part by part (text, inlineData, fileData, functionCall,
functionResponse, executableCode, codeExecutionResult; `thought`, `thoughtSignature`
and the other part fields ride along) and turned into the neutral transcript:
`systemInstruction` becomes the system message (it is sent on as the client sent
it); a `functionResponse` part its own tool message, a `model` turn an assistant
message whose `functionCall` parts are listed as `tool_calls` too, so the assembler
sees calls and answers as on every path. A result `{"output": text}` (Gemini CLI's
shape) or `{"error": text}` (a failed call, `is_error`) is captured as that text,
byte for byte; any other response as its JSON. Calls and responses pair by `id`;
where the client sent none (the API does not require one), by order within the turn,
under an id made from the call's place (`gemini-call-<turn>-<part>`), which is stable
across requests and never sent upstream.

Out: the projection rendered back as `contents`; a compacted result is a
functionResponse holding the memory text as its `output`; a call whose arguments
were compacted gets the compacted `args`. Parts the gateway did not change go back
as they came, thought signatures included. Answers and stream chunks are Google's
own (`candidates`, `usageMetadata`); errors are `{"error": {"code", "message", "status"}}`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from gateway.errors import GatewayError, InvalidRequest
from gateway.wire import NeutralRequest
from gateway.wire.json_body import check_count, check_text, parse_json_object
from policies.protocol import orphan_tool_messages

NAME_MAX = 256
_DATA_FIELDS = ("text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode",
                "codeExecutionResult")
_OWN_FIELDS = ("contents", "model")  # read or rewritten; every other field goes on as the client sent it
_ROLES = ("user", "model")
_SYNTHETIC = "gemini-call-"


def _fail(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param)


def _check_part(part: Any, param: str, role: str) -> None:
    if not isinstance(part, dict):
        raise _fail(param, "a part is an object")
    data = [f for f in _DATA_FIELDS if f in part]
    if len(data) != 1:
        raise _fail(param, f"a part holds exactly one of {', '.join(_DATA_FIELDS)}")
    kind = data[0]
    value = part[kind]
    if kind == "text":
        if not isinstance(value, str):
            raise _fail(f"{param}.text", "text")
        check_text(value, f"{param}.text")
    elif not isinstance(value, dict):
        raise _fail(f"{param}.{kind}", "an object")
    if kind in ("functionCall", "functionResponse"):
        where = f"{param}.{kind}"
        if not isinstance(value.get("name"), str) or not 0 < len(value["name"]) <= NAME_MAX:
            raise _fail(f"{where}.name", f"1 to {NAME_MAX} characters")
        check_text(value["name"], f"{where}.name")
        if "id" in value and (not isinstance(value["id"], str) or not 0 < len(value["id"]) <= NAME_MAX
                              or value["id"].startswith(_SYNTHETIC)):
            raise _fail(f"{where}.id", f"1 to {NAME_MAX} characters, not starting {_SYNTHETIC!r}")
        if kind == "functionCall" and not isinstance(value.get("args", {}), dict):
            raise _fail(f"{where}.args", "an object")
        if kind == "functionResponse" and not isinstance(value.get("response"), dict):
            raise _fail(f"{where}.response", "an object")
        if (kind == "functionCall") != (role == "model"):
            raise _fail(param, f"a {kind} part cannot be in a {role} turn")
    if "thoughtSignature" in part and not isinstance(part["thoughtSignature"], str):
        raise _fail(f"{param}.thoughtSignature", "a string")


def _check_content(content: Any, param: str, default_role: str = "user") -> str:
    if not isinstance(content, dict):
        raise _fail(param, "a content is an object with `parts`")
    role = content.get("role", default_role)
    if role not in _ROLES:
        raise _fail(f"{param}.role", "'user' or 'model'")
    parts = content.get("parts")
    if not isinstance(parts, list) or not parts:
        raise _fail(f"{param}.parts", "a non-empty list of parts")
    for number, part in enumerate(parts):
        _check_part(part, f"{param}.parts[{number}]", role)
    return role


def _block(part: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    """A part as a neutral content block: plain text as Chat's text part, any other kept whole."""
    if set(part) == {"text"}:
        return {"type": "text", "text": part["text"]}
    block = {"type": "gemini_part", "part": part}
    return {**block, "call_id": call_id} if call_id is not None else block


def _arguments(args: Any) -> str:
    return json.dumps(args if args is not None else {}, ensure_ascii=False)


def _tool_message(response: dict[str, Any], call_id: str) -> dict[str, Any]:
    """A functionResponse as a tool message: the result's text where it is one, else its JSON."""
    rest = {k: v for k, v in response.items() if k not in ("name", "id")}
    message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "name": response["name"]}
    result = rest.get("response")
    field, text = next(iter(result.items())) if set(rest) == {"response"} and len(result) == 1 else (None, None)
    if field in ("output", "error") and isinstance(text, str):
        message["content"], message["result_field"] = text, field
        if field == "error":
            message["is_error"] = True
    else:
        message["content"] = json.dumps(rest, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        message["result_field"] = "json"
    if "id" not in response:
        message["unnamed"] = True
    return message


def to_neutral(system: Any, contents: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """(the neutral transcript, the Gemini location of each neutral message, for error messages)."""
    out: list[dict[str, Any]] = []
    where: list[str] = []
    if isinstance(system, dict) and system.get("parts"):
        texts = [p.get("text") for p in system["parts"] if isinstance(p, dict)]
        out.append({"role": "system", "content": "\n".join(t for t in texts if isinstance(t, str))})
        where.append("systemInstruction")
    unnamed: list[tuple[str, str]] = []  # (synthetic id, name) of the latest model turn's calls without an id
    for index, content in enumerate(contents):
        here = f"contents[{index}]"
        parts = content["parts"]
        if content.get("role", "user") == "model":
            blocks, calls, unnamed = [], [], []
            for number, part in enumerate(parts):
                call = part.get("functionCall")
                if call is None:
                    blocks.append(_block(part))
                    continue
                call_id = call.get("id") or f"{_SYNTHETIC}{index}-{number}"
                if "id" not in call:
                    unnamed.append((call_id, call["name"]))
                blocks.append(_block(part, call_id))
                calls.append({"id": call_id, "type": "function",
                              "function": {"name": call["name"], "arguments": _arguments(call.get("args"))}})
            message: dict[str, Any] = {"role": "assistant", "content": blocks}
            if calls:
                message["tool_calls"] = calls
            out.append(message)
            where.append(here)
            continue
        others = []
        for number, part in enumerate(parts):
            response = part.get("functionResponse")
            if response is None:
                others.append(_block(part))
                continue
            call_id = response.get("id")
            if call_id is None:
                match = next((u for u in unnamed if u[1] == response["name"]), unnamed[0] if unnamed else None)
                call_id = match[0] if match else f"{_SYNTHETIC}unanswered-{index}-{number}"
                if match:
                    unnamed.remove(match)
            out.append(_tool_message(response, call_id))
            where.append(f"{here}.parts[{number}]")
        if others:
            out.append({"role": "user", "content": others})
            where.append(here)
    return out, where


def _checked(body: dict[str, Any]) -> list[dict[str, Any]]:
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise _fail("contents", "a non-empty list of contents")
    for index, content in enumerate(contents):
        _check_content(content, f"contents[{index}]")
    if "systemInstruction" in body:
        system = body["systemInstruction"]
        if isinstance(system, str):  # the REST API takes a bare string too
            system = {"parts": [{"text": system}]}
        _check_content(system, "systemInstruction")
    for field in ("tools", "safetySettings"):
        if field in body and not isinstance(body[field], list):
            raise _fail(field, "a list")
    for field in ("generationConfig", "toolConfig"):
        if field in body and not isinstance(body[field], dict):
            raise _fail(field, "an object")
    return contents


def parse_gemini_body(body: dict[str, Any], model: str, stream: bool, sse: bool) -> NeutralRequest:
    contents = _checked(body)
    system = body.get("systemInstruction")
    if isinstance(system, str):
        system = {"parts": [{"text": system}]}
    messages, where = to_neutral(system, contents)
    orphans = orphan_tool_messages(messages)
    if orphans:
        index, reason = orphans[0]
        reason = reason.replace("a tool message", "a functionResponse part").replace(
            "an assistant message with tool_calls", "a model turn with functionCall parts")
        raise InvalidRequest(f"{where[index]}: {reason}", param=where[index], code="invalid_tool_message")
    params = {k: v for k, v in body.items() if k not in _OWN_FIELDS}
    return NeutralRequest(model=model, messages=messages, stream=stream, params=params, sse=sse)


# -- from the neutral transcript back to Gemini's shape ---------------------------

def _text_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    parts = []
    for block in content or []:
        if block.get("type") == "gemini_part":
            parts.append(block["part"])
        elif block.get("type") == "text":
            parts.append({"text": block.get("text", "")})
        else:  # a block another format wrote (a memory's, a notice's): its text
            parts.append({"text": block.get("text") or json.dumps(block, ensure_ascii=False)})
    return parts


def _call_part(call: dict[str, Any], original: dict[str, Any] | None) -> dict[str, Any]:
    """The functionCall part for a neutral call: the original where its arguments are unchanged."""
    arguments = call["function"].get("arguments") or "{}"
    if original is not None and arguments == _arguments(original["functionCall"].get("args")):
        return original
    try:
        args = json.loads(arguments)
    except ValueError:
        args = {"arguments": arguments}
    args = args if isinstance(args, dict) else {"value": args}
    function_call = {**(original or {}).get("functionCall", {}), "name": call["function"]["name"], "args": args}
    if original is None and not call["id"].startswith(_SYNTHETIC):
        function_call["id"] = call["id"]
    return {**(original or {}), "functionCall": function_call}


def _model_turn(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    calls = {c["id"]: c for c in message.get("tool_calls") or []}
    if not isinstance(content, list):
        parts = _text_parts(content) + [_call_part(c, None) for c in calls.values()]
        return {"role": "model", "parts": parts or [{"text": ""}]}
    parts = []
    for block in content:
        call_id = block.get("call_id")
        if block.get("type") == "gemini_part" and call_id is not None:
            if call_id in calls:
                parts.append(_call_part(calls[call_id], block["part"]))
            continue
        parts += _text_parts([block])
    return {"role": "model", "parts": parts or [{"text": ""}]}


def _response_part(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    field = message.get("result_field", "output")
    rest: dict[str, Any] | None = None
    if field == "json":
        try:
            rest = json.loads(text)
        except ValueError:
            rest = None
        rest = rest if isinstance(rest, dict) and isinstance(rest.get("response"), dict) else None
    key = field if field != "json" else "output"
    response = {"name": message.get("name", ""), **(rest or {"response": {key: text}})}
    if not message.get("unnamed"):
        response["id"] = message["tool_call_id"]
    return {"functionResponse": response}


def from_neutral(messages: list[dict[str, Any]], *, top_system: bool) -> list[dict[str, Any]]:
    """Gemini `contents` for a projection of the neutral transcript. `top_system`: the first neutral
    message is the request's `systemInstruction`, sent as the client sent it."""
    out: list[dict[str, Any]] = []
    responses: list[dict[str, Any]] = []

    def user(parts: list[dict[str, Any]]) -> None:
        nonlocal responses
        if responses or parts:
            out.append({"role": "user", "parts": responses + parts})
        responses = []

    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "system" and index == 0 and top_system:
            continue
        if role == "tool":
            responses.append(_response_part(message))
        elif role == "assistant":
            user([])
            out.append(_model_turn(message))
        else:  # a user turn; a system message elsewhere (Gemini has no such role) goes as user text
            user(_text_parts(message.get("content")) or [{"text": ""}])
    user([])
    return out


# -- errors, answers, usage ----------------------------------------------------------

_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           408: "DEADLINE_EXCEEDED", 409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
           499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
           504: "DEADLINE_EXCEEDED"}


def error_body(error: GatewayError) -> dict[str, Any]:
    status = error.status_code
    message = error.message if not error.param or error.param in error.message else f"{error.param}: {error.message}"
    name = _STATUS.get(status) or ("INVALID_ARGUMENT" if 400 <= status < 500 else "INTERNAL")
    body: dict[str, Any] = {"code": status, "message": message, "status": name}
    details: list[dict[str, Any]] = []
    if error.code:
        details.append({"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": error.code,
                        "domain": "context-gateway"})
    if error.param and 400 <= status < 500:
        details.append({"@type": "type.googleapis.com/google.rpc.BadRequest",
                        "fieldViolations": [{"field": error.param, "description": error.message}]})
    if details:
        body["details"] = details
    return {"error": body}


def chunk_json(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def sse(chunk: dict[str, Any]) -> bytes:
    """One server-sent event as Google sends them: a `data:` line and a blank line, nothing else."""
    return f"data: {chunk_json(chunk)}\r\n\r\n".encode()


_USAGE_KEYS = ("promptTokenCount", "candidatesTokenCount", "totalTokenCount", "cachedContentTokenCount",
               "thoughtsTokenCount", "toolUsePromptTokenCount")


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """usageMetadata summed over answers: its token counts (the per-modality details are left out)."""
    if not usage:
        return total
    out = dict(total or {})
    for key in _USAGE_KEYS:
        if isinstance(usage.get(key), int):
            out[key] = (out.get(key) or 0) + usage[key]
    return out


def run_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """usageMetadata as the run records it (Chat's shape): the prompt includes the cached tokens, the
    completion the thoughts."""
    if not usage:
        return None
    prompt = (usage.get("promptTokenCount") or 0) + (usage.get("toolUsePromptTokenCount") or 0)
    completion = (usage.get("candidatesTokenCount") or 0) + (usage.get("thoughtsTokenCount") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": usage.get("cachedContentTokenCount") or 0}}


def first_candidate(answer: Mapping[str, Any]) -> dict[str, Any]:
    """An answer's first candidate ({} if it has none): the one whose turn the transcript goes on with."""
    candidates = answer.get("candidates")
    return candidates[0] if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict) else {}


def candidate_parts(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The first candidate's parts (the gateway asks for one candidate's worth of transcript)."""
    first = first_candidate(answer)
    parts = (first.get("content") or {}).get("parts") if isinstance(first.get("content"), dict) else None
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


@dataclass(frozen=True)
class GeminiCall:
    """The Gemini format for one request: the model and the method named by its path."""

    model: str
    stream: bool = False
    sse: bool = True
    name = "google.gemini"
    upstream = "generate_content"
    adds_tools_midway = False
    marks_cache = False

    def parse(self, raw: bytes, max_messages: int | None = None) -> NeutralRequest:
        body = check_count(parse_json_object(raw), "contents", max_messages)
        return parse_gemini_body(body, self.model, self.stream, self.sse)

    def parse_count(self, raw: bytes, max_messages: int | None = None) -> NeutralRequest:
        """A countTokens body: `contents`, or a whole `generateContentRequest`."""
        body = parse_json_object(raw)
        inner = body.get("generateContentRequest")
        if inner is not None:
            if not isinstance(inner, dict):
                raise _fail("generateContentRequest", "an object")
            body = inner
        return parse_gemini_body(check_count(body, "contents", max_messages), self.model, False, True)

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return error_body(error)

    def stream_error(self, error: GatewayError) -> bytes:
        return sse(error_body(error))

    def upstream_body(self, request: NeutralRequest, messages: list[dict[str, Any]],
                      stable: Sequence[int] = (), addition: tuple[dict[str, Any], int] | None = None
                      ) -> dict[str, Any]:
        """The client's fields (its systemInstruction as sent) with `contents` rendered from the projection."""
        assert addition is None, "the Gemini format declares the gateway's tool in `tools`"
        top_system = bool(messages) and messages[0].get("role") == "system" and "systemInstruction" in request.params
        return {**request.params, "contents": from_neutral(messages, top_system=top_system)}

    def rehydration_tool(self, name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"functionDeclarations": [{"name": name, "description": description, "parametersJsonSchema": schema}]}

    def answer_message(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        parts = candidate_parts(body)
        if not parts:
            return None
        try:
            for number, part in enumerate(parts):
                _check_part(part, f"parts[{number}]", "model")
        except InvalidRequest:
            return None
        return to_neutral(None, [{"role": "model", "parts": parts}])[0][0]

    def call(self, model: str, stream: bool, sse: bool) -> "GeminiCall":
        return replace(self, model=model, stream=stream, sse=sse)


GEMINI = GeminiCall(model="")
