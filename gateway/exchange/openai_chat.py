"""The Chat Completions dialect of the exchange (gateway/exchange/driver.py runs the rounds).

JSON: the gateway's calls are taken out of every choice of the final answer (a
`tool_calls` finish with no client call left becomes `stop`), and the summed
usage put in. Stream: content passes as it arrives, until a round shows a call
to the gateway's tool (its name arrives early); tool-call deltas and finishes
are held until the round ends. Usage chunks are held too, and one usage chunk,
summed over the rounds, closes the stream (passed on if the client asked for it).
An answer left with no content and no call once the gateway's calls are out gets
the exchange's `unanswered` text as its content.
"""
from __future__ import annotations

from typing import Any, Iterator

from gateway.errors import GatewayError
from gateway.exchange.chat_chunks import StreamAccumulator
from gateway.exchange.dialect import Answer, Completion, Dialect, GatewayTool
from gateway.exchange.driver import Exchange
from gateway.wire import openai_chat as wire
from gateway.wire.openai_chat import OPENAI_CHAT, SSE_DONE, sse_event


class ChatDialect(Dialect):
    api = "chat"
    field = "messages"

    add_usage = staticmethod(wire.add_usage)

    def gateway_calls(self, answer: Answer, tool: GatewayTool) -> list[dict[str, Any]]:
        message = _message(answer)
        return [c for c in message.get("tool_calls") or [] if tool.is_call(c)]

    def without_tool(self, body: dict[str, Any], name: str) -> dict[str, Any]:
        return without_tool(body, name)

    def hidden_round(self, answer: Answer, calls: list[dict[str, Any]], answers: list[str]) -> list[dict[str, Any]]:
        message = _message(answer)
        assistant = {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
        return [assistant, *({"role": "tool", "tool_call_id": c["id"], "content": a} for c, a in zip(calls, answers))]

    def completion(self, answer: Answer, calls: list[dict[str, Any]], usage: dict[str, Any] | None,
                   exchange: Exchange) -> Completion:
        if exchange.rehydrator is None:
            return _completion(answer)
        final = _without_gateway_calls(answer, exchange.rehydrator)
        if calls and not _says_anything(_message(final)):
            final = _with_content(final, exchange.unanswered())
        return _completion({**final, "usage": usage} if usage else final)

    def stream(self, exchange: Exchange) -> "ChatStream":
        return ChatStream(exchange.rehydrator, exchange.client.wants_stream_usage, exchange)


def without_tool(body: dict[str, Any], name: str) -> dict[str, Any]:
    """A Chat request without the function `name` in its tools."""
    tools = [t for t in body.get("tools") or [] if not (isinstance(t, dict) and isinstance(t.get("function"), dict)
                                                        and t["function"].get("name") == name)]
    out = {**body, "tools": tools}
    if not tools:
        for key in ("tools", "tool_choice", "parallel_tool_calls"):
            out.pop(key, None)
    return out


def _says_anything(message: dict[str, Any]) -> bool:
    return bool(message.get("content") or message.get("tool_calls"))


def _with_content(response: Answer, text: str) -> Answer:
    """The answer with `text` as the first choice's content (it had none)."""
    choices = list(response.get("choices") or [{"index": 0, "finish_reason": "stop"}])
    choices[0] = {**choices[0], "message": {**(choices[0].get("message") or {"role": "assistant"}), "content": text}}
    return {**response, "choices": choices}


def _completion(response: Answer) -> Completion:
    choices = response.get("choices") or [{}]
    return Completion(body=response, usage=response.get("usage"), finish_reason=choices[0].get("finish_reason"))


def _message(answer: Answer) -> dict[str, Any]:
    """The first choice's message."""
    return ((answer.get("choices") or [{}])[0]).get("message") or {}


def _without_gateway_calls(response: Answer, tool: GatewayTool) -> Answer:
    """The final answer without calls to the gateway's tool (past the round bound)."""
    choices = []
    for choice in response.get("choices") or []:
        message = dict(choice.get("message") or {})
        kept = [c for c in message.get("tool_calls") or [] if not tool.is_call(c)]
        if kept:
            message["tool_calls"] = kept
        else:
            message.pop("tool_calls", None)
        finish = choice.get("finish_reason")
        if finish == "tool_calls" and not kept:
            finish = "stop"
        choices.append({**choice, "message": message, "finish_reason": finish})
    return {**response, "choices": choices}


class ChatStream:
    """The client's chat.completion.chunk stream; every chunk sent is folded into its answer."""

    def __init__(self, tool: GatewayTool | None, wants_usage: bool, exchange: Exchange | None = None) -> None:
        self.tool = tool
        self.wants_usage = wants_usage
        self.exchange = exchange
        self.accumulator = StreamAccumulator()

    def round(self, first: bool) -> "ChatRound":
        return ChatRound(self)

    def send(self, chunk: dict[str, Any]) -> bytes:
        self.accumulator.add(chunk)
        return sse_event(chunk)

    def end(self, last: "ChatRound", calls: list[dict[str, Any]], usage: dict[str, Any] | None) -> Iterator[bytes]:
        held = _release_without_gateway_calls(last.held, self.tool) if calls and self.tool else last.held
        if calls and self.exchange is not None and not self.accumulator.content_text() \
                and not any(_delta_calls(chunk) for chunk in held):
            accumulator = self.accumulator
            yield self.send({"id": accumulator.id, "created": accumulator.created, "model": accumulator.model,
                             "object": "chat.completion.chunk", "choices": [
                                 {"index": 0, "delta": {"role": "assistant", "content": self.exchange.unanswered()},
                                  "finish_reason": None}]})
        for chunk in held:
            yield self.send(chunk)
        if usage:
            accumulator = self.accumulator
            chunk = {"id": accumulator.id, "created": accumulator.created, "model": accumulator.model,
                     "object": "chat.completion.chunk", "choices": [], "usage": usage}
            accumulator.add(chunk)
            if self.wants_usage:
                yield sse_event(chunk)

    @property
    def completion(self) -> Completion:
        return _completion(self.accumulator.response())

    def terminal(self) -> bytes:
        return SSE_DONE

    def error(self, error: GatewayError) -> bytes:
        return OPENAI_CHAT.stream_error(error)  # and no [DONE]: the stream did not complete


class ChatRound:
    """One round's chunks: content passes until the gateway's tool shows; calls and finishes are held."""

    ended = False  # a Chat stream ends with its upstream stream
    answered = True

    def __init__(self, stream: ChatStream) -> None:
        self.stream = stream
        self.accumulator = StreamAccumulator()
        self.held: list[dict[str, Any]] = []  # tool-call and finish chunks, released when the round ends
        self.hidden = False  # the round calls the gateway's tool: nothing more of it is shown
        self.usage: dict[str, Any] | None = None

    def read(self, chunk: dict[str, Any]) -> Iterator[bytes]:
        self.accumulator.add(chunk)
        if chunk.get("usage"):
            self.usage = wire.add_usage(self.usage, chunk["usage"])
            if not chunk.get("choices"):
                return
            chunk = {k: v for k, v in chunk.items() if k != "usage"}
        tool = self.stream.tool
        if tool is None:
            yield self.stream.send(chunk)
            return
        if any(tool.is_call(c) for c in _delta_calls(chunk)) or any(
                (call.get("function") or {}).get("name") == tool.name for call in self.accumulator.tool_calls.values()):
            self.hidden = True  # recognised as soon as the name arrives
        if _delta_calls(chunk) or _finish(chunk):
            self.held.append(_without_content(chunk, keep_content=False))
            if _content(chunk) and not self.hidden:
                yield self.stream.send(_without_content(chunk, keep_content=True, drop_calls=True))
            return
        if not self.hidden:
            yield self.stream.send(chunk)

    def finish(self) -> Answer:
        return {**self.accumulator.response(), "usage": self.usage}


def _delta_calls(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for choice in chunk.get("choices") or []:
        calls += (choice.get("delta") or {}).get("tool_calls") or []
    return calls


def _finish(chunk: dict[str, Any]) -> bool:
    return any(choice.get("finish_reason") for choice in chunk.get("choices") or [])


def _content(chunk: dict[str, Any]) -> bool:
    return any((choice.get("delta") or {}).get("content") for choice in chunk.get("choices") or [])


def _without_content(chunk: dict[str, Any], *, keep_content: bool, drop_calls: bool = False) -> dict[str, Any]:
    choices = []
    for choice in chunk.get("choices") or []:
        delta = dict(choice.get("delta") or {})
        if not keep_content:
            delta.pop("content", None)
        if drop_calls:
            delta.pop("tool_calls", None)
            choice = {**choice, "finish_reason": None}
        choices.append({**choice, "delta": delta})
    return {**chunk, "choices": choices}


def _release_without_gateway_calls(held: list[dict[str, Any]], tool: GatewayTool) -> list[dict[str, Any]]:
    """Held chunks minus the gateway tool's deltas (identified by index once its name was seen).

    If no client call is left, a `tool_calls` finish becomes `stop`, as in the JSON answer.
    """
    gateway_indexes: set[int] = set()
    client_calls = False
    out = []
    for chunk in held:
        choices = []
        for choice in chunk.get("choices") or []:
            delta = dict(choice.get("delta") or {})
            kept = []
            for call in delta.get("tool_calls") or []:
                if tool.is_call(call):
                    gateway_indexes.add(call.get("index", 0))
                if call.get("index", 0) not in gateway_indexes:
                    kept.append(call)
                    client_calls = True
            if "tool_calls" in delta:
                if kept:
                    delta["tool_calls"] = kept
                else:
                    delta.pop("tool_calls")
            finish = choice.get("finish_reason")
            if finish == "tool_calls" and not client_calls:
                finish = "stop"
            choices.append({**choice, "delta": delta, "finish_reason": finish})
        out.append({**chunk, "choices": choices})
    return out


CHAT = ChatDialect()
