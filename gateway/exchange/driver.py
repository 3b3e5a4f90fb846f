"""The one driver of hidden rounds, for every wire format, JSON and streamed.

When the model calls the gateway's rehydration tool, the gateway answers the
call, appends the round and its answers to the upstream request, and asks the
model again (up to the policy's bound). The client receives only the final
answer, as JSON (`complete`) or as one stream (`Relay`): what the model says
passes as it arrives; tool calls are held until the round ends, because a round
that calls the gateway's tool is dropped whole, client calls included. Usage of
all rounds is summed.

The bound never ends in silence: the round that reaches it tells the model so in
the tool's answer, and the request after it goes without the gateway's tool (the
dialect takes it out), so the model answers or calls the client's own tools. A
model that calls the gateway's tool anyway has those calls taken out of the final
answer; if nothing else is left, the dialect gives the client the gateway's text
saying the limit was reached (`Exchange.unanswered`). Each is on the run's
record. What differs between formats is the format's `Dialect`
(gateway/exchange/dialect.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, AsyncIterator

from gateway.errors import GatewayError
from gateway.exchange.dialect import Answer, Completion, Dialect
from gateway.ops.tracing import OFF, Tracing
from gateway.pipeline.rehydration import Rehydrator
from gateway.threads import off_loop
from gateway.upstream.seam import UpstreamClient, UpstreamRequest, close_stream, closing
from gateway.wire import NeutralRequest


@dataclass
class Exchange:
    """The upstream exchange: one request to the provider, growing over hidden rounds."""

    dialect: Dialect
    request: UpstreamRequest
    rehydrator: Rehydrator | None
    client: NeutralRequest  # the client's request it answers
    tracing: Tracing = OFF
    rounds: int = 0

    def gateway_calls(self, answer: Answer) -> list[dict[str, Any]]:
        """The answer's calls to the gateway's tool (none when the tool was not offered)."""
        return [] if self.rehydrator is None else self.dialect.gateway_calls(answer, self.rehydrator)

    def more_rounds_allowed(self) -> bool:
        return self.rehydrator is not None and self.rounds < self.rehydrator.policy.rehydration.max_rounds

    async def hide_round(self, answer: Answer, calls: list[dict[str, Any]]) -> None:
        """Answer the gateway's `calls` in `answer`, and append the round and the answers to the request.
        The round that reaches the bound says so after its answers, and the tool leaves the request."""
        answers = await self.answer([self.dialect.as_tool_call(call) for call in calls])
        body = dict(self.request.body)
        rehydrator = self.rehydrator
        if rehydrator is not None and not self.more_rounds_allowed():
            answers[-1] = f"{answers[-1]}\n{rehydrator.limit_notice()}"
            body = self.dialect.without_tool(body, rehydrator.name)
        body[self.dialect.field] = [*body[self.dialect.field], *self.dialect.hidden_round(answer, calls, answers)]
        self.request = replace(self.request, body=body)

    async def answer(self, calls: list[Any]) -> list[str]:
        """The gateway's answers to one round of calls to its tool (a `gateway.pipeline.rehydration` span)."""
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

    def final_calls(self, calls: list[dict[str, Any]]) -> None:
        """The last answer's calls to the gateway's tool, which are not answered: past the bound, recorded."""
        if calls and self.rehydrator is not None and not self.more_rounds_allowed():
            self.rehydrator.past_limit(len(calls))

    def unanswered(self) -> str:
        """The text a client gets when the last answer held nothing but calls to the gateway's tool (recorded)."""
        assert self.rehydrator is not None
        return self.rehydrator.unanswered(limit=not self.more_rounds_allowed())


async def complete(upstream: UpstreamClient, exchange: Exchange) -> Completion:
    """The final answer as JSON, after any hidden rounds."""
    dialect = exchange.dialect
    usage: dict[str, Any] | None = None
    while True:
        answer = await upstream.call(dialect.api, exchange.request)
        usage = dialect.add_usage(usage, answer.get(dialect.usage_field))
        calls = exchange.gateway_calls(answer)
        if calls and exchange.more_rounds_allowed():
            await exchange.hide_round(answer, calls)
            continue
        exchange.final_calls(calls)
        return dialect.completion(answer, calls, usage, exchange)


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


class Relay:
    """A streamed answer on its way to the client, in the client's format: hidden rounds removed,
    parts renumbered as one answer, usage summed. Each round's upstream stream is closed when the
    round ends, whatever ends it."""

    def __init__(self, upstream: UpstreamClient, exchange: Exchange) -> None:
        self.upstream = upstream
        self.exchange = exchange
        self.view = exchange.dialect.stream(exchange)
        self._first = FirstRound(upstream.stream(exchange.dialect.api, exchange.request))

    async def start(self) -> None:
        """Open the first upstream round; an error here is still an ordinary HTTP error."""
        await self._first.open()

    async def events(self) -> AsyncIterator[bytes]:
        """Every frame but the terminal one; raises GatewayError if the stream fails."""
        exchange, dialect = self.exchange, self.exchange.dialect
        events: AsyncIterator[dict[str, Any]] = self._first
        usage: dict[str, Any] | None = None
        first = True
        while True:
            current = self.view.round(first)
            async with closing(events):  # the round's stream, also when it ends early
                async for event in events:
                    for frame in current.read(event):
                        yield frame
                    if current.ended:
                        break
            answer = current.finish()
            usage = dialect.add_usage(usage, answer.get(dialect.usage_field))
            calls = exchange.gateway_calls(answer)
            if calls and current.answered and exchange.more_rounds_allowed():
                await exchange.hide_round(answer, calls)
                events = self.upstream.stream(dialect.api, exchange.request)
                first = False
                continue
            exchange.final_calls(calls)
            for frame in self.view.end(current, calls, usage):
                yield frame
            return

    @property
    def media_type(self) -> str:
        return getattr(self.view, "media_type", "text/event-stream")

    @property
    def completion(self) -> Completion:
        return self.view.completion

    def terminal(self) -> bytes:
        return self.view.terminal()

    def error(self, error: GatewayError) -> bytes:
        """The frame that ends a failed stream, in the stream's own terms."""
        return self.view.error(error)

    async def aclose(self) -> None:
        """Close the upstream stream `start` opened, if `events` never ran to close it (idempotent)."""
        await self._first.aclose()
