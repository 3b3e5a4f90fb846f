"""The driver of hidden rounds (gateway/exchange/driver.py), with a scripted dialect and upstream.

The dialect here is a toy format: an answer is `{"text", "calls", "usage"}`, a stream is events
`{"text"}`, `{"call"}`, `{"usage"}` and `{"end"}`; text passes at once, calls are held until the
round ends. So what is checked is the driver's own part, whatever the format: which rounds are
hidden and how the request grows, the bound on rounds (the round that reaches it says so, the
request after it goes without the tool, an answer left empty gets the gateway's text), the usage
sum, what a stream relays, and that every upstream stream is closed whatever ends it.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, AsyncIterator, Iterator, Mapping

import pytest

from gateway.errors import GatewayError, UpstreamInvalidResponse, UpstreamUnavailable
from gateway.exchange import Completion, Exchange, Relay, complete
from gateway.upstream.seam import UpstreamRequest
from gateway.wire import NeutralRequest

TOOL = "gateway_rehydrate"


def gateway_call(number: int) -> dict[str, Any]:
    return {"id": f"gw_{number}", "name": TOOL}


CLIENT_CALL = {"id": "call_1", "name": "read_file"}


@dataclass
class StubRehydrator:
    max_rounds: int = 2
    asked: list[list[str]] = field(default_factory=list)  # the calls of each round it answered
    rehydrations: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 0
    name: str = TOOL
    told: list[str] = field(default_factory=list)  # the limit's moments, in order

    def limit_notice(self) -> str:
        self.told.append(f"notice:{self.rounds}")
        return "[last round]"

    def past_limit(self, calls: int) -> None:
        self.told.append(f"past:{calls}")

    def unanswered(self, limit: bool = True) -> str:
        self.told.append("unanswered" if limit else "cut")
        return "[limit reached]"

    @property
    def policy(self) -> Any:
        return SimpleNamespace(rehydration=SimpleNamespace(max_rounds=self.max_rounds))

    def is_call(self, call: Mapping[str, Any]) -> bool:
        return call.get("name") == TOOL

    def answer(self, call: Mapping[str, Any]) -> str:
        while len(self.asked) < self.rounds:  # the exchange numbers the round before answering it
            self.asked.append([])
        self.asked[-1].append(str(call["id"]))
        return f"bytes of {call['id']}"


class ToyStream:
    """The client's side: text frames at once, calls at the round's end, then the usage."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.text: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.usage: dict[str, Any] | None = None

    def round(self, first: bool) -> "ToyRound":
        return ToyRound(self)

    def end(self, last: "ToyRound", calls: list[dict[str, Any]], usage: dict[str, Any] | None) -> Iterator[bytes]:
        for call in last.calls:
            if call not in calls:
                self.calls.append(call)
                yield f"call:{call['id']}".encode()
        if calls and not self.text and not self.calls:
            self.text.append(self.exchange.unanswered())
            yield f"text:{self.text[-1]}".encode()
        self.usage = usage
        yield f"usage:{(usage or {}).get('tokens')}".encode()

    @property
    def completion(self) -> Completion:
        return Completion(body={"text": "".join(self.text), "calls": self.calls}, usage=self.usage,
                          finish_reason="stop")

    def terminal(self) -> bytes:
        return b"end"

    def error(self, error: GatewayError) -> bytes:
        return f"error:{error.code}".encode()


class ToyRound:
    def __init__(self, stream: ToyStream) -> None:
        self.stream = stream
        self.text: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.usage: dict[str, Any] | None = None
        self.ended = False
        self.answered = True

    def read(self, event: dict[str, Any]) -> Iterator[bytes]:
        if "text" in event:
            self.text.append(event["text"])
            self.stream.text.append(event["text"])
            yield f"text:{event['text']}".encode()
        elif "call" in event:
            self.calls.append(event["call"])
        elif "usage" in event:
            self.usage = {"tokens": event["usage"]}
        elif "end" in event:
            self.ended, self.answered = True, event["end"] == "completed"

    def finish(self) -> dict[str, Any]:
        if not self.ended:
            raise UpstreamInvalidResponse("upstream: the stream ended before its end")
        return {"text": "".join(self.text), "calls": self.calls, "usage": self.usage}


class ToyDialect:
    api = "toy"
    field = "turns"
    usage_field = "usage"

    def usage(self, answer: dict[str, Any]) -> dict[str, Any] | None:
        return answer.get("usage")

    def add_usage(self, total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
        if not usage:
            return total
        return {"tokens": (total or {}).get("tokens", 0) + usage["tokens"]}

    def gateway_calls(self, answer: dict[str, Any], tool: Any) -> list[dict[str, Any]]:
        return [c for c in answer["calls"] if tool is not None and tool.is_call(c)]

    def as_tool_call(self, call: dict[str, Any]) -> Mapping[str, Any]:
        return call

    def without_tool(self, body: dict[str, Any], name: str) -> dict[str, Any]:
        return {**body, "tools": [t for t in body["tools"] if t != name]}

    def hidden_round(self, answer: dict[str, Any], calls: list[dict[str, Any]], answers: list[str]) -> list[Any]:
        return [{"said": answer["text"], "calls": [c["id"] for c in calls]}, *answers]

    def completion(self, answer: dict[str, Any], calls: list[dict[str, Any]], usage: dict[str, Any] | None,
                   exchange: Exchange) -> Completion:
        body = {"text": answer["text"], "calls": [c for c in answer["calls"] if c not in calls]}
        if calls and not body["text"] and not body["calls"]:
            body["text"] = exchange.unanswered()
        return Completion(body=body, usage=usage, finish_reason="stop")

    def stream(self, exchange: Exchange) -> ToyStream:
        return ToyStream(exchange)


@dataclass
class ScriptedUpstream:
    """Answers (JSON) or rounds of events (streams) in turn; notes each request and each stream closed.
    A round's event that is an exception is raised there."""

    script: list[Any]
    requests: list[list[Any]] = field(default_factory=list)  # each call's `turns`, as sent
    tools: list[list[str]] = field(default_factory=list)  # each call's `tools`, as sent
    closed: list[int] = field(default_factory=list)

    async def call(self, api: str, request: UpstreamRequest) -> dict[str, Any]:
        assert api == "toy"
        self.requests.append(list(request.body["turns"]))
        self.tools.append(list(request.body["tools"]))
        return self.script[len(self.requests) - 1]

    def stream(self, api: str, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        assert api == "toy"
        self.requests.append(list(request.body["turns"]))
        self.tools.append(list(request.body["tools"]))
        return self._round(len(self.requests) - 1)

    async def _round(self, number: int) -> AsyncIterator[dict[str, Any]]:
        try:
            for event in self.script[number]:
                await asyncio.sleep(0)
                if isinstance(event, Exception):
                    raise event
                yield event
        finally:
            self.closed.append(number)


def exchange_for(rehydrator: StubRehydrator | None) -> Exchange:
    request = UpstreamRequest(alias="m", litellm_params={"model": "openai/m"}, body={"turns": ["the total?"], "tools": ["read_file", TOOL]},
                              timeout_seconds=10, request_id="req_1")
    return Exchange(dialect=ToyDialect(), request=request, rehydrator=rehydrator,  # type: ignore[arg-type]
                    client=NeutralRequest(model="m", messages=[], stream=False))


def answer(text: str, calls: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    return {"text": text, "calls": calls, "usage": {"tokens": tokens}}


def test_json_hidden_rounds_are_answered_appended_and_their_usage_summed() -> None:
    upstream = ScriptedUpstream([answer("let me look", [gateway_call(1)], 10), answer("", [gateway_call(2)], 20),
                                 answer("the total is 7", [], 30)])
    rehydrator = StubRehydrator(max_rounds=2)
    exchange = exchange_for(rehydrator)
    completion = asyncio.run(complete(upstream, exchange))  # type: ignore[arg-type]

    assert completion.body == {"text": "the total is 7", "calls": []}
    assert completion.usage == {"tokens": 60}
    assert rehydrator.asked == [["gw_1"], ["gw_2"]] and exchange.rounds == 2
    round_1 = [{"said": "let me look", "calls": ["gw_1"]}, "bytes of gw_1"]
    round_2 = [{"said": "", "calls": ["gw_2"]}, "bytes of gw_2\n[last round]"]  # the round that reaches the bound
    assert upstream.requests == [["the total?"], ["the total?", *round_1], ["the total?", *round_1, *round_2]]
    assert upstream.tools == [["read_file", TOOL], ["read_file", TOOL], ["read_file"]]  # the last goes without it
    assert rehydrator.told == ["notice:2"]


def test_json_past_the_bound_the_answer_goes_out_without_the_gateway_calls() -> None:
    upstream = ScriptedUpstream([answer("a", [gateway_call(1)], 1), answer("b", [gateway_call(2), CLIENT_CALL], 2)])
    completion = asyncio.run(complete(upstream, exchange_for(StubRehydrator(max_rounds=1))))  # type: ignore[arg-type]

    assert len(upstream.requests) == 2
    assert completion.body == {"text": "b", "calls": [CLIENT_CALL]}
    assert completion.usage == {"tokens": 3}


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_of_nothing_but_gateway_calls_past_the_bound_is_the_gateways_text(stream: bool) -> None:
    rehydrator = StubRehydrator(max_rounds=1)
    exchange = exchange_for(rehydrator)
    if stream:
        upstream = ScriptedUpstream([[{"call": gateway_call(1)}, {"end": "completed"}],
                                     [{"call": gateway_call(2)}, {"call": gateway_call(3)}, {"end": "completed"}]])
        relay = Relay(upstream, exchange)  # type: ignore[arg-type]
        assert asyncio.run(relayed(relay)) == [b"text:[limit reached]", b"usage:None"]
        body = relay.completion.body
    else:
        upstream = ScriptedUpstream([answer("", [gateway_call(1)], 1), answer("", [gateway_call(2), gateway_call(3)], 2)])
        body = asyncio.run(complete(upstream, exchange)).body  # type: ignore[arg-type]
    assert body == {"text": "[limit reached]", "calls": []}
    assert upstream.tools == [["read_file", TOOL], ["read_file"]]
    assert rehydrator.told == ["notice:1", "past:2", "unanswered"]


def test_past_the_bound_the_models_own_text_is_the_answer() -> None:
    rehydrator = StubRehydrator(max_rounds=1)
    upstream = ScriptedUpstream([answer("", [gateway_call(1)], 1), answer("I found 7", [gateway_call(2)], 2)])
    completion = asyncio.run(complete(upstream, exchange_for(rehydrator)))  # type: ignore[arg-type]

    assert completion.body == {"text": "I found 7", "calls": []}
    assert rehydrator.told == ["notice:1", "past:1"]


def test_json_without_the_tool_every_answer_is_the_clients() -> None:
    upstream = ScriptedUpstream([answer("a", [gateway_call(1)], 5)])
    completion = asyncio.run(complete(upstream, exchange_for(None)))  # type: ignore[arg-type]

    assert len(upstream.requests) == 1
    assert completion.body == {"text": "a", "calls": [gateway_call(1)]} and completion.usage == {"tokens": 5}


async def relayed(relay: Relay) -> list[bytes]:
    await relay.start()
    return [frame async for frame in relay.events()]


def test_a_stream_hides_the_round_that_calls_the_gateway_and_sums_usage() -> None:
    upstream = ScriptedUpstream([
        [{"text": "let me look"}, {"call": gateway_call(1)}, {"call": CLIENT_CALL}, {"usage": 10}, {"end": "completed"},
         {"text": "after the end: never read"}],
        [{"text": "the total"}, {"text": " is 7"}, {"call": CLIENT_CALL}, {"usage": 20}, {"end": "completed"}],
    ])
    rehydrator = StubRehydrator()
    relay = Relay(upstream, exchange_for(rehydrator))  # type: ignore[arg-type]
    frames = asyncio.run(relayed(relay))

    # The hidden round's text passed (this dialect lets it), its calls did not, the client's included.
    assert frames == [b"text:let me look", b"text:the total", b"text: is 7", b"call:call_1", b"usage:30"]
    assert relay.terminal() == b"end"
    assert relay.completion.usage == {"tokens": 30} and relay.completion.body["calls"] == [CLIENT_CALL]
    assert upstream.requests[1][1:] == [{"said": "let me look", "calls": ["gw_1"]}, "bytes of gw_1"]
    assert upstream.closed == [0, 1] and rehydrator.asked == [["gw_1"]]


def test_a_stream_past_the_bound_leaves_the_gateway_calls_to_the_dialect() -> None:
    upstream = ScriptedUpstream([[{"call": gateway_call(1)}, {"usage": 1}, {"end": "completed"}],
                                 [{"call": gateway_call(2)}, {"call": CLIENT_CALL}, {"usage": 2}, {"end": "completed"}]])
    frames = asyncio.run(relayed(Relay(upstream, exchange_for(StubRehydrator(max_rounds=1)))))  # type: ignore[arg-type]

    assert frames == [b"call:call_1", b"usage:3"]


def test_a_round_not_answered_in_full_is_not_followed_by_a_hidden_one() -> None:
    upstream = ScriptedUpstream([[{"text": "cut"}, {"call": gateway_call(1)}, {"end": "incomplete"}]])
    rehydrator = StubRehydrator()
    frames = asyncio.run(relayed(Relay(upstream, exchange_for(rehydrator))))  # type: ignore[arg-type]

    assert frames == [b"text:cut", b"usage:None"] and rehydrator.asked == [] and len(upstream.requests) == 1


def test_an_upstream_error_mid_stream_ends_the_relay_and_closes_the_round() -> None:
    failure = UpstreamUnavailable("upstream: connection reset")
    upstream = ScriptedUpstream([[{"call": gateway_call(1)}, {"end": "completed"}],
                                 [{"text": "the total"}, failure, {"text": "never"}]])
    relay = Relay(upstream, exchange_for(StubRehydrator()))  # type: ignore[arg-type]

    async def run() -> list[bytes]:
        frames = []
        with pytest.raises(UpstreamUnavailable) as raised:
            await relay.start()
            async for frame in relay.events():
                frames.append(frame)
        frames.append(relay.error(raised.value))
        await relay.aclose()
        return frames

    frames = asyncio.run(run())
    assert frames == [b"text:the total", f"error:{failure.code}".encode()]
    assert upstream.closed == [0, 1]


def test_a_stream_that_stops_before_its_end_is_an_invalid_answer_and_closed() -> None:
    upstream = ScriptedUpstream([[{"text": "half"}]])
    relay = Relay(upstream, exchange_for(StubRehydrator()))  # type: ignore[arg-type]

    with pytest.raises(UpstreamInvalidResponse):
        asyncio.run(relayed(relay))
    assert upstream.closed == [0]


def test_a_reader_that_leaves_mid_round_closes_it_and_a_first_round_never_read_is_closed() -> None:
    upstream = ScriptedUpstream([[{"call": gateway_call(1)}, {"end": "completed"}],
                                 [{"text": "the total"}, {"text": " is 7"}, {"end": "completed"}]])
    relay = Relay(upstream, exchange_for(StubRehydrator()))  # type: ignore[arg-type]

    async def leave() -> None:
        await relay.start()
        events = relay.events()
        async for frame in events:
            assert frame == b"text:the total"
            break
        assert upstream.closed == [0]
        await events.aclose()
        await relay.aclose()  # idempotent: the first round was closed by the relay already

    asyncio.run(leave())
    assert upstream.closed == [0, 1]

    never = ScriptedUpstream([[{"text": "unread"}, {"end": "completed"}]])
    unread = Relay(never, exchange_for(StubRehydrator()))  # type: ignore[arg-type]

    async def close_unread() -> None:
        await unread.start()
        await unread.aclose()

    asyncio.run(close_unread())
    assert never.closed == [0]
