"""The Responses dialect of the exchange (gateway/exchange/driver.py runs the rounds).

JSON: the final response, the gateway's `function_call` items removed, usage
summed. Stream: one `response.created`, the output items of every round
numbered as one response (text and reasoning stream through as they arrive;
function call items are held until the round ends), events renumbered, and one
terminal event with the whole output and the summed usage. Only a completed
round is followed by a hidden one. Either way the response is the client's: the
gateway's id (gateway/wire/openai_responses.py `response_id_for`), the client's
`store` flag, and no gateway tool in `tools`. An output left with no message and no
call once the gateway's calls are out gets a message with the exchange's
`unanswered` text.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

from gateway.errors import GatewayError, UpstreamInvalidResponse
from gateway.exchange.dialect import Answer, Completion, Dialect, GatewayTool
from gateway.exchange.driver import Exchange
from gateway.wire import openai_responses as wire
from gateway.wire.openai_responses import error_event, response_id_for, run_usage, sse

_TERMINAL = ("response.completed", "response.failed", "response.incomplete")
_OPENING = ("response.created", "response.in_progress", "response.queued")


class ResponsesDialect(Dialect):
    api = "responses"
    field = "input"

    add_usage = staticmethod(wire.add_usage)

    def gateway_calls(self, answer: Answer, tool: GatewayTool) -> list[dict[str, Any]]:
        return [i for i in answer.get("output") or [] if i.get("type") == "function_call" and i.get("name") == tool.name]

    def as_tool_call(self, call: dict[str, Any]) -> Mapping[str, Any]:
        """A function_call item in the shape the rehydrator reads (a Chat call)."""
        return {"id": call.get("call_id"), "function": {"name": call.get("name"), "arguments": call.get("arguments")}}

    def without_tool(self, body: dict[str, Any], name: str) -> dict[str, Any]:
        tools = [t for t in body.get("tools") or [] if not (isinstance(t, dict) and t.get("type") == "function"
                                                            and t.get("name") == name)]
        out = {**body, "tools": tools}
        if not tools:
            for key in ("tools", "tool_choice", "parallel_tool_calls"):
                out.pop(key, None)
        return out

    def hidden_round(self, answer: Answer, calls: list[dict[str, Any]], answers: list[str]) -> list[dict[str, Any]]:
        """The round's items (its gateway calls only: a client call would stand unanswered) and the answers."""
        ids = {c["call_id"] for c in calls}
        kept = [i for i in answer.get("output") or []
                if i.get("type") not in ("function_call", "custom_tool_call") or i.get("call_id") in ids]
        return [*kept, *({"type": "function_call_output", "call_id": c["call_id"], "output": a}
                         for c, a in zip(calls, answers))]

    def completion(self, answer: Answer, calls: list[dict[str, Any]], usage: dict[str, Any] | None,
                   exchange: Exchange) -> Completion:
        output = [i for i in answer.get("output") or [] if i not in calls]
        if calls and not _says_anything(output):
            output.append(_message(exchange, exchange.unanswered()))
        final = _as_clients({**answer, "output": output, "usage": usage or answer.get("usage")}, exchange)
        return Completion(body=final, usage=run_usage(final["usage"]), finish_reason=final.get("status"))

    def stream(self, exchange: Exchange) -> "ResponsesStream":
        return ResponsesStream(exchange)


def _as_clients(response: dict[str, Any], exchange: Exchange) -> dict[str, Any]:
    """The response as the client's: the gateway's id and tool out of it, the client's store flag in."""
    out = {**response, "id": response_id_for(exchange.request.request_id),
           "store": exchange.client.params.get("store") is not False}
    if exchange.rehydrator is not None and isinstance(response.get("tools"), list):
        out["tools"] = [t for t in response["tools"] if t.get("name") != exchange.rehydrator.name]
    return out


def _says_anything(output: list[dict[str, Any]]) -> bool:
    """Whether output items say something to the client: a message with text, or a call of any kind."""
    for item in output:
        kind = str(item.get("type") or "")
        parts = [p for p in item.get("content") or [] if isinstance(p, dict)] if kind == "message" else []
        if kind.endswith("_call") or any(p.get("text") or p.get("refusal") for p in parts):
            return True
    return False


def _message(exchange: Exchange, text: str) -> dict[str, Any]:
    """A message item of the gateway's own (the text a client gets instead of an empty answer)."""
    return {"type": "message", "id": f"msg_gateway_{exchange.request.request_id.removeprefix('req_')}",
            "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _message_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """The events that stream the message `item` at output `index` (numbered when emitted)."""
    part = item["content"][0]
    base = {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [{"type": "response.output_item.added", "output_index": index,
             "item": {**item, "status": "in_progress", "content": []}},
            {"type": "response.content_part.added", **base, "part": {**part, "text": ""}},
            {"type": "response.output_text.delta", **base, "delta": part["text"]},
            {"type": "response.output_text.done", **base, "text": part["text"]},
            {"type": "response.content_part.done", **base, "part": part},
            {"type": "response.output_item.done", "output_index": index, "item": item}]


class ResponsesStream:
    """The client's response: its output items numbered across rounds, its events in one sequence."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.response: dict[str, Any] = {}
        self.output: list[dict[str, Any]] = []
        self.usage: dict[str, Any] | None = None
        self._sequence = 0
        self._terminal: dict[str, Any] | None = None

    def emit(self, event: dict[str, Any]) -> bytes:
        event = {**event, "sequence_number": self._sequence}
        self._sequence += 1
        return sse(event)

    def ours(self, response: dict[str, Any]) -> dict[str, Any]:
        return _as_clients(response, self.exchange)

    def round(self, first: bool) -> "ResponsesRound":
        return ResponsesRound(self, first)

    def end(self, last: "ResponsesRound", calls: list[dict[str, Any]], usage: dict[str, Any] | None
            ) -> Iterator[bytes]:
        call_ids = {c.get("call_id") for c in calls}
        for index in sorted(last.held):
            item = last.items.get(index) or {}
            if item.get("call_id") in call_ids:
                continue  # past the round bound: the gateway's call is not the client's
            new = len(self.output)
            self.output.append(item)
            for event in last.held[index]:
                yield self.emit({**event, "output_index": new})
        if calls and not _says_anything(self.output):
            item = _message(self.exchange, self.exchange.unanswered())
            for event in _message_events(item, len(self.output)):
                yield self.emit(event)
            self.output.append(item)
        assert last.terminal is not None
        self.usage = usage
        self.response = self.ours({**(last.terminal.get("response") or {}), "output": self.output, "usage": usage})
        self._terminal = {**last.terminal, "response": self.response}

    @property
    def completion(self) -> Completion:
        return Completion(body=self.response, usage=run_usage(self.usage), finish_reason=self.response.get("status"))

    def terminal(self) -> bytes:
        assert self._terminal is not None
        return self.emit(self._terminal)

    def error(self, error: GatewayError) -> bytes:
        """The `error` event that ends the stream, numbered after the events before it."""
        return self.emit(error_event(error))


class ResponsesRound:
    """One round's events: output items re-indexed and passed on, function call items held."""

    def __init__(self, stream: ResponsesStream, first: bool) -> None:
        self.stream = stream
        self.first = first
        self.offset = len(stream.output)  # the client's index of this round's first item shown
        self.shown: dict[int, int] = {}
        self.held: dict[int, list[dict[str, Any]]] = {}
        self.items: dict[int, dict[str, Any]] = {}  # output_item.done's
        self.terminal: dict[str, Any] | None = None
        self.ended = False
        self.answered = False

    def read(self, event: dict[str, Any]) -> Iterator[bytes]:
        kind = event.get("type")
        if kind in _OPENING:
            if self.first:
                self.stream.response = self.stream.ours(event.get("response") or {})
                yield self.stream.emit({**event, "response": self.stream.response})
            return
        if kind in _TERMINAL:
            self.terminal, self.ended = event, True
            self.answered = kind == "response.completed"
            return
        index = event.get("output_index")
        if index is None:
            yield self.stream.emit(event)
            return
        if kind == "response.output_item.added" and (event.get("item") or {}).get("type") == "function_call":
            self.held[index] = []
        if kind == "response.output_item.done":
            self.items[index] = event.get("item") or {}
        if index in self.held:
            self.held[index].append(event)
            return
        if index not in self.shown:
            self.shown[index] = self.offset + len(self.shown)
        yield self.stream.emit({**event, "output_index": self.shown[index]})

    def finish(self) -> Answer:
        if self.terminal is None:
            raise UpstreamInvalidResponse("upstream: the stream ended before response.completed")
        response = self.terminal.get("response") or {}
        self.stream.output += [self.items.get(i, {}) for i in sorted(self.shown)]
        return {**response, "output": [self.items[i] for i in sorted(self.items)] or list(response.get("output") or [])}


RESPONSES = ResponsesDialect()
