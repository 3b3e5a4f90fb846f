"""Calling the upstream for one Chat Completions request, including the rounds the client never sees.

When the model calls the rehydration tool, the gateway answers the call,
appends the call and its answer, and asks the model again (up to the
policy's bound). The client receives only the final answer, as JSON or as
one SSE stream: content streams through as it arrives; tool-call deltas are
held until the round ends, because a round that calls the rehydration tool is
dropped whole, client calls included. Usage of all rounds is summed.

`gateway/messages_forwarding.py` does the same for Anthropic Messages; both
give the pipeline a `Completion` for the record, and a relay for streams.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Protocol

from gateway.rehydration import Rehydrator
from gateway.streaming import StreamAccumulator
from gateway.threads import off_loop
from gateway.tracing import OFF, Tracing
from gateway.upstream import UpstreamClient, UpstreamRequest, close_stream, closing
from gateway.errors import GatewayError
from gateway.wire import NeutralRequest
from gateway.wire.openai_chat import OPENAI_CHAT, SSE_DONE, sse_event

_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens", "cache_creation_input_tokens")


@dataclass(frozen=True)
class Completion:
    """A finished answer: the body the client gets, and what the run records of it."""

    body: dict[str, Any]  # in the client's format
    usage: dict[str, Any] | None  # Chat-shaped: prompt/completion/total tokens, cached and cache-write tokens
    finish_reason: str | None


class Relay(Protocol):
    """A streamed answer on its way to the client, in the client's format."""

    async def start(self) -> None:
        """Open the first upstream round; an error here is still an ordinary HTTP error."""

    def events(self) -> AsyncIterator[bytes]:
        """Every frame but the terminal one; raises GatewayError if the stream fails."""

    @property
    def completion(self) -> Completion: ...

    def terminal(self) -> bytes: ...

    def error(self, error: GatewayError) -> bytes:
        """The frame that ends a failed stream, in the stream's own terms."""

    async def aclose(self) -> None:
        """Close the upstream stream `start` opened, if `events` never ran to close it (idempotent)."""


class FirstRound:
    """The first upstream round of a relayed stream: opened before any byte goes to the client (so
    an error there is an ordinary HTTP error), then iterated from its first event. Whoever opens it
    closes it (`aclose`, or `async with closing(first_round)`), however the stream ends."""

    def __init__(self, events: AsyncIterator[dict[str, Any]]) -> None:
        self._events = events.__aiter__()
        self._first: dict[str, Any] | None = None

    async def open(self) -> None:
        try:
            self._first = await self._events.__anext__()
        except StopAsyncIteration:
            self._first = None

    def __aiter__(self) -> "FirstRound":
        return self

    async def __anext__(self) -> dict[str, Any]:
        first, self._first = self._first, None
        return first if first is not None else await self._events.__anext__()

    async def aclose(self) -> None:
        await close_stream(self._events)


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
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


@dataclass
class Conversation:
    """The upstream request as it grows over hidden rounds."""

    request: UpstreamRequest
    rehydrator: Rehydrator | None
    usage: dict[str, Any] | None = None  # Chat-shaped, summed over rounds
    rounds: int = 0
    client_store: bool = True  # Responses: whether the client asked the response to be stored
    tracing: Tracing = OFF

    def extend(self, *messages: dict[str, Any], field: str = "messages") -> None:
        """Append messages (a hidden round) to the upstream request's transcript (`input` for Responses)."""
        body = dict(self.request.body)
        body[field] = [*body[field], *messages]
        self.request = replace(self.request, body=body)

    def more_rounds_allowed(self) -> bool:
        return self.rehydrator is not None and self.rounds < self.rehydrator.policy.rehydration.max_rounds

    async def answer(self, calls: list[dict[str, Any]]) -> list[str]:
        """The gateway's answers to one round of calls to its tool (a `gateway.rehydration` span)."""
        rehydrator = self.rehydrator
        assert rehydrator is not None
        rehydrator.rounds = self.rounds + 1
        decided = len(rehydrator.rehydrations)
        with self.tracing.span("gateway.rehydration", {"gateway.rehydration.round": rehydrator.rounds,
                                                       "gateway.rehydration.calls": len(calls)}) as span:
            answers = [await off_loop(rehydrator.answer, call) for call in calls]
            decisions = rehydrator.rehydrations[decided:]
            span.set_attributes({
                "gateway.rehydration.artifact_ids": [str(d.get("artifact_id")) for d in decisions
                                                     if d.get("action") == "rehydrated"],
                "gateway.rehydration.refused": sum(d.get("action") == "rehydration_refused" for d in decisions),
            })
        self.rounds += 1
        return answers


def _with_round(conversation: Conversation, assistant: dict[str, Any], calls: list[dict[str, Any]],
                answers: list[str]) -> None:
    """Append the model's rehydration calls (only those) and their answers."""
    message = {"role": "assistant", "content": assistant.get("content"), "tool_calls": calls}
    replies = [{"role": "tool", "tool_call_id": c["id"], "content": a} for c, a in zip(calls, answers)]
    conversation.extend(message, *replies)


def _strip_gateway_calls(response: dict[str, Any], rehydrator: Rehydrator) -> dict[str, Any]:
    """The final answer without calls to the gateway's tool (past the round bound)."""
    choices = []
    for choice in response.get("choices") or []:
        message = dict(choice.get("message") or {})
        kept = [c for c in message.get("tool_calls") or [] if not rehydrator.is_call(c)]
        if kept:
            message["tool_calls"] = kept
        else:
            message.pop("tool_calls", None)
        finish = choice.get("finish_reason")
        if finish == "tool_calls" and not kept:
            finish = "stop"
        choices.append({**choice, "message": message, "finish_reason": finish})
    return {**response, "choices": choices}


def _completion(response: dict[str, Any]) -> Completion:
    choices = response.get("choices") or [{}]
    return Completion(body=response, usage=response.get("usage"), finish_reason=choices[0].get("finish_reason"))


async def complete(upstream: UpstreamClient, conversation: Conversation) -> Completion:
    """The final chat.completion, after any hidden rehydration rounds."""
    while True:
        response = await upstream.complete(conversation.request)
        conversation.usage = add_usage(conversation.usage, response.get("usage"))
        rehydrator = conversation.rehydrator
        if rehydrator is None:
            return _completion(response)
        message = ((response.get("choices") or [{}])[0]).get("message") or {}
        calls = [c for c in message.get("tool_calls") or [] if rehydrator.is_call(c)]
        if not calls or not conversation.more_rounds_allowed():
            final = _strip_gateway_calls(response, rehydrator)
            return _completion({**final, "usage": conversation.usage} if conversation.usage else final)
        _with_round(conversation, message, calls, await conversation.answer(calls))


class ChatRelay:
    """A chat.completion.chunk stream for the client, hidden rounds removed, usage summed."""

    def __init__(self, upstream: UpstreamClient, conversation: Conversation, request: NeutralRequest) -> None:
        self.upstream = upstream
        self.conversation = conversation
        self.request = request
        self.accumulator = StreamAccumulator()
        self._first = FirstRound(upstream.stream(conversation.request))

    async def start(self) -> None:
        await self._first.open()

    async def events(self) -> AsyncIterator[bytes]:
        accumulator = self.accumulator
        async with closing(_stream(self.upstream, self.conversation, self._first)) as chunks:
            async for chunk, is_usage in chunks:
                if is_usage:
                    chunk = {"id": accumulator.id, "created": accumulator.created, "model": accumulator.model,
                             **chunk}
                    accumulator.add(chunk)
                    if self.request.wants_stream_usage:
                        yield sse_event(chunk)
                    continue
                accumulator.add(chunk)
                yield sse_event(chunk)

    @property
    def completion(self) -> Completion:
        return _completion(self.accumulator.response())

    def terminal(self) -> bytes:
        return SSE_DONE

    def error(self, error: GatewayError) -> bytes:
        return OPENAI_CHAT.stream_error(error)  # and no [DONE]: the stream did not complete

    async def aclose(self) -> None:
        await self._first.aclose()


async def _stream(
    upstream: UpstreamClient, conversation: Conversation, first_round: AsyncIterator[dict[str, Any]]
) -> AsyncIterator[tuple[dict[str, Any], bool]]:
    """(chunk, is_usage) pairs for the client; rounds that call the gateway's tool are hidden. Each
    round's upstream stream is closed when the round ends, whatever ends it."""
    chunks = first_round
    while True:
        rehydrator = conversation.rehydrator
        accumulator = StreamAccumulator()
        held: list[dict[str, Any]] = []  # tool-call and finish chunks, released when the round ends
        hidden = False
        async with closing(chunks):
            async for chunk in chunks:
                accumulator.add(chunk)
                if chunk.get("usage") and not chunk.get("choices"):
                    conversation.usage = add_usage(conversation.usage, chunk["usage"])
                    continue
                if chunk.get("usage"):
                    conversation.usage = add_usage(conversation.usage, chunk["usage"])
                    chunk = {k: v for k, v in chunk.items() if k != "usage"}
                if rehydrator is None:
                    yield chunk, False
                    continue
                if any(rehydrator.is_call(c) for c in _delta_calls(chunk)) or any(
                        (accumulator.tool_calls.get(i) or {}).get("function", {}).get("name") == rehydrator.name
                        for i in accumulator.tool_calls):
                    hidden = True  # recognised as soon as the name arrives
                if _delta_calls(chunk) or _finish(chunk):
                    held.append(_without_content(chunk, keep_content=False))
                    if _content(chunk) and not hidden:
                        yield _without_content(chunk, keep_content=True, drop_calls=True), False
                    continue
                if not hidden:
                    yield chunk, False
        message = accumulator.message()
        calls = [c for c in message.get("tool_calls") or [] if rehydrator and rehydrator.is_call(c)]
        if rehydrator is None or not calls:
            for chunk in held:
                yield chunk, False
            break
        if not conversation.more_rounds_allowed():
            for chunk in _release_without_gateway_calls(held, rehydrator):
                yield chunk, False
            break
        _with_round(conversation, message, calls, await conversation.answer(calls))
        chunks = upstream.stream(conversation.request)
    if conversation.usage:
        yield {"object": "chat.completion.chunk", "choices": [], "usage": conversation.usage}, True


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


def _release_without_gateway_calls(held: list[dict[str, Any]], rehydrator: Rehydrator) -> list[dict[str, Any]]:
    """Held chunks minus the gateway tool's deltas (identified by index once its name was seen).

    If no client call is left, a `tool_calls` finish becomes `stop`, as in the JSON path.
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
                if rehydrator.is_call(call):
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
