"""The Gemini dialect of the exchange (gateway/exchange/driver.py runs the rounds).

JSON: the final answer, the gateway's `functionCall` parts taken out of the first
candidate, `usageMetadata` summed. Stream: Google's chunks (each a whole
GenerateContentResponse holding the parts that arrived), as server-sent events or,
without `alt=sse`, as one JSON array. Text and thought parts stream through as they
arrive; `functionCall` parts are held until the round ends (a round that calls the
gateway's tool is dropped whole). The last chunk holds the round's held calls, the
finish reason and the summed usage. A Gemini stream has no terminal event: a round
ends with its upstream stream, and one that ended without a finish reason is an
invalid answer. An answer left with no text and no call once the gateway's calls
are out gets a text part with the exchange's `unanswered` text.
"""
from __future__ import annotations

import json
from typing import Any, Iterator

from gateway.errors import GatewayError, UpstreamInvalidResponse
from gateway.exchange.dialect import Answer, Completion, Dialect, GatewayTool
from gateway.exchange.driver import Exchange
from gateway.wire import gemini as wire
from gateway.wire.gemini import candidate_parts, chunk_json, error_body, first_candidate, run_usage


def _is_call(part: dict[str, Any]) -> bool:
    return isinstance(part.get("functionCall"), dict)


def _with_parts(answer: Answer, parts: list[dict[str, Any]], **candidate: Any) -> dict[str, Any]:
    """The answer with its first candidate's parts (and `candidate`'s fields) replaced."""
    first = first_candidate(answer)
    content = {**(first.get("content") or {}), "role": "model", "parts": parts}
    rest = answer.get("candidates")[1:] if isinstance(answer.get("candidates"), list) else []
    return {**answer, "candidates": [{**first, "content": content, **candidate}, *rest]}


def _says_anything(parts: list[dict[str, Any]]) -> bool:
    return any(_is_call(p) or isinstance(p.get("text"), str) and p["text"] and not p.get("thought") for p in parts)


def without_tool(body: dict[str, Any], name: str) -> dict[str, Any]:
    """A generateContent request without the function declaration `name` (an entry left empty goes)."""
    tools = []
    for tool in body.get("tools") or []:
        declared = tool.get("functionDeclarations") if isinstance(tool, dict) else None
        if not isinstance(declared, list):
            tools.append(tool)
            continue
        kept = [d for d in declared if not (isinstance(d, dict) and d.get("name") == name)]
        if kept or set(tool) != {"functionDeclarations"}:
            tools.append({**tool, "functionDeclarations": kept} if kept else
                         {k: v for k, v in tool.items() if k != "functionDeclarations"})
    out = {**body, "tools": tools}
    if not tools:
        out.pop("tools")
    return out


class GeminiDialect(Dialect):
    api = "generate_content"
    field = "contents"
    usage_field = "usageMetadata"

    add_usage = staticmethod(wire.add_usage)

    def gateway_calls(self, answer: Answer, tool: GatewayTool) -> list[dict[str, Any]]:
        return [p for p in candidate_parts(answer) if _is_call(p) and p["functionCall"].get("name") == tool.name]

    def as_tool_call(self, call: dict[str, Any]) -> dict[str, Any]:
        """A functionCall part in the shape the rehydrator reads (a Chat call)."""
        function_call = call["functionCall"]
        return {"id": function_call.get("id"), "function": {"name": function_call.get("name"),
                                                            "arguments": json.dumps(function_call.get("args") or {})}}

    def without_tool(self, body: dict[str, Any], name: str) -> dict[str, Any]:
        return without_tool(body, name)

    def hidden_round(self, answer: Answer, calls: list[dict[str, Any]], answers: list[str]) -> list[dict[str, Any]]:
        """The model turn (its gateway calls only: a client call would stand unanswered) and the user turn
        that answers them, each response under its call's id where the call has one."""
        kept = [p for p in candidate_parts(answer) if not _is_call(p) or p in calls]
        responses = []
        for call, text in zip(calls, answers):
            response = {"name": call["functionCall"]["name"], "response": {"output": text}}
            if "id" in call["functionCall"]:
                response["id"] = call["functionCall"]["id"]
            responses.append({"functionResponse": response})
        return [{"role": "model", "parts": kept}, {"role": "user", "parts": responses}]

    def completion(self, answer: Answer, calls: list[dict[str, Any]], usage: dict[str, Any] | None,
                   exchange: Exchange) -> Completion:
        parts = [p for p in candidate_parts(answer) if p not in calls]
        if calls and not _says_anything(parts):
            parts.append({"text": exchange.unanswered()})
        final = _with_parts(answer, parts) if calls else dict(answer)
        if usage is not None:
            final["usageMetadata"] = {**(answer.get("usageMetadata") or {}), **usage}
        return Completion(body=final, usage=run_usage(final.get("usageMetadata")),
                          finish_reason=first_candidate(final).get("finishReason"))

    def stream(self, exchange: Exchange) -> "GeminiStream":
        return GeminiStream(exchange.client.sse, exchange)


class GeminiStream:
    """The client's stream: one chunk per upstream chunk that shows something, one last chunk."""

    def __init__(self, sse: bool, exchange: Exchange | None = None) -> None:
        self.sse = sse
        self.exchange = exchange
        self.media_type = "text/event-stream" if sse else "application/json"
        self.shown: list[dict[str, Any]] = []  # the client's parts, across rounds
        self.head: dict[str, Any] = {}  # the first chunk's fields (modelVersion, responseId)
        self.final: dict[str, Any] = {}
        self._frames = 0

    def frame(self, chunk: dict[str, Any]) -> bytes:
        self._frames += 1
        if self.sse:
            return wire.sse(chunk)
        return ("[" if self._frames == 1 else ",\r\n").encode() + chunk_json(chunk).encode()

    def round(self, first: bool) -> "GeminiRound":
        return GeminiRound(self)

    def end(self, last: "GeminiRound", calls: list[dict[str, Any]], usage: dict[str, Any] | None) -> Iterator[bytes]:
        held = [p for p in last.held if p not in calls]
        if calls and self.exchange is not None and not _says_anything(self.shown + held):
            held.append({"text": self.exchange.unanswered()})
        self.shown += held
        candidate = {k: v for k, v in last.candidate.items() if k != "content"}
        closing = _with_parts({**self.head, "candidates": [candidate]}, held or [{"text": ""}])
        if usage is not None:
            closing["usageMetadata"] = usage
        self.final = _with_parts(closing, self.shown)
        yield self.frame(closing)

    @property
    def completion(self) -> Completion:
        usage = self.final.get("usageMetadata")
        return Completion(body=self.final, usage=run_usage(usage),
                          finish_reason=first_candidate(self.final).get("finishReason"))

    def terminal(self) -> bytes:
        if self.sse:
            return b""
        return b"]" if self._frames else b"[]"

    def error(self, error: GatewayError) -> bytes:
        """The error object Google's clients read in a stream (an SSE event, or the array's last item)."""
        if self.sse:
            return wire.sse(error_body(error))
        return self.frame(error_body(error)) + b"]"


class GeminiRound:
    """One round's chunks: what shows passes at once, functionCall parts are held, the finish is kept."""

    ended = False  # a Gemini stream has no terminal event: the round ends with its upstream stream

    def __init__(self, stream: GeminiStream) -> None:
        self.stream = stream
        self.parts: list[dict[str, Any]] = []  # every part of the round, in order
        self.candidate: dict[str, Any] = {}  # the latest chunk's first candidate (its finishReason...)
        self.usage: dict[str, Any] | None = None
        self.answered = False

    def read(self, event: dict[str, Any]) -> Iterator[bytes]:
        if not self.stream.head:
            self.stream.head = {k: v for k, v in event.items() if k in ("modelVersion", "responseId")}
        candidate = first_candidate(event)
        if candidate:
            self.candidate = {**self.candidate, **candidate}
        if isinstance(event.get("usageMetadata"), dict):
            self.usage = event["usageMetadata"]  # each chunk's counts are the round's so far
        if candidate.get("finishReason"):
            self.answered = True
        parts = candidate_parts(event)
        self.parts += parts
        shown = [p for p in parts if not _is_call(p) and p != {"text": ""}]  # an empty text shows nothing
        if shown:
            self.stream.shown += shown
            bare = {k: v for k, v in candidate.items() if k not in ("finishReason", "content")}
            yield self.stream.frame(_with_parts({**self.stream.head, "candidates": [bare]}, shown))

    @property
    def held(self) -> list[dict[str, Any]]:
        """The round's functionCall parts: held until it ends."""
        return [p for p in self.parts if _is_call(p)]

    def finish(self) -> Answer:
        if not self.answered:
            raise UpstreamInvalidResponse("upstream: the stream ended before its finishReason")
        answer = _with_parts({"candidates": [self.candidate]}, _joined(self.parts))
        if self.usage is not None:
            answer["usageMetadata"] = self.usage
        return answer


def _joined(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A round's parts as one answer: plain text pieces that arrived in turn joined, empty ones dropped."""
    out: list[dict[str, Any]] = []
    for part in parts:
        if part == {"text": ""}:
            continue
        if set(part) == {"text"} and out and set(out[-1]) == {"text"}:
            out[-1] = {"text": out[-1]["text"] + part["text"]}
        else:
            out.append(part)
    return out


GEMINI = GeminiDialect()
