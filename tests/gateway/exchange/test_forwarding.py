"""The stream relay (gateway/exchange/driver.py), in each dialect (Chat, Anthropic Messages, Responses),
closes every upstream round it opens: a hidden round the gateway's own tool ends early, the last round
read to its end, a round under way when the reader stops, and a first round never read at all.

The upstream is scripted here: each round is an async generator that notes when it is opened and
closed, and holds one event past the round's end (as an upstream whose last bytes have not been
read yet), so a round that is only left, not closed, shows.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, AsyncIterator, Callable

import pytest

from gateway.exchange import DIALECTS, Exchange, Relay
from gateway.upstream.seam import UpstreamRequest
from gateway.wire import NeutralRequest

TOOL = "gateway_rehydrate"
ARGUMENTS = json.dumps({"artifact_id": "a1"})


def chat_rounds() -> list[list[dict[str, Any]]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "c", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": delta, "finish_reason": finish}]}

    call = {"index": 0, "id": "gw_1", "type": "function", "function": {"name": TOOL, "arguments": ARGUMENTS}}
    return [[chunk({"role": "assistant", "tool_calls": [call]}), chunk({}, "tool_calls")],
            [chunk({"role": "assistant", "content": "the total"}), chunk({"content": " is 7"}), chunk({}, "stop")]]


def messages_rounds() -> list[list[dict[str, Any]]]:
    start = {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": [],
                                                  "usage": {"input_tokens": 5, "output_tokens": 1}}}

    def end(stop: str) -> list[dict[str, Any]]:
        return [{"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 3}},
                {"type": "message_stop"}, {"type": "ping"}]  # a ping after the end: never reached

    call = {"type": "tool_use", "id": "gw_1", "name": TOOL, "input": {}}
    return [[start, {"type": "content_block_start", "index": 0, "content_block": call},
             {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": ARGUMENTS}},
             {"type": "content_block_stop", "index": 0}, *end("tool_use")],
            [start, {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
             {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "the total"}},
             {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " is 7"}},
             {"type": "content_block_stop", "index": 0}, *end("end_turn")]]


def responses_rounds() -> list[list[dict[str, Any]]]:
    call = {"type": "function_call", "id": "fc_1", "call_id": "gw_1", "name": TOOL, "arguments": ARGUMENTS}
    message = {"type": "message", "id": "msg_1", "role": "assistant",
               "content": [{"type": "output_text", "text": "the total is 7"}]}

    def response(output: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": "resp_u", "object": "response", "status": "completed", "output": output,
                "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}}

    def rounds(item: dict[str, Any], *deltas: str) -> list[dict[str, Any]]:
        return [{"type": "response.created", "response": response([])},
                {"type": "response.output_item.added", "output_index": 0, "item": item},
                *({"type": "response.output_text.delta", "output_index": 0, "delta": d} for d in deltas),
                {"type": "response.output_item.done", "output_index": 0, "item": item},
                {"type": "response.completed", "response": response([item])},
                {"type": "response.in_progress"}]  # after the end: never reached

    return [rounds(call), rounds(message, "the total", " is 7")]


@dataclass
class ScriptedUpstream:
    """Streams each scripted round in turn, noting which were opened and which closed."""

    rounds: list[list[dict[str, Any]]]
    opened: int = 0
    closed: list[int] = field(default_factory=list)
    closed_before: list[list[int]] = field(default_factory=list)  # as each round opened: those closed by then

    async def _round(self, number: int) -> AsyncIterator[dict[str, Any]]:
        try:
            for event in self.rounds[number]:
                await asyncio.sleep(0)
                yield event
        finally:
            self.closed.append(number)

    def stream(self, api: str, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        self.closed_before.append(list(self.closed))
        self.opened += 1
        return self._round(self.opened - 1)


@dataclass
class StubRehydrator:
    """The gateway's tool, answered without a store."""

    policy: Any = field(default_factory=lambda: SimpleNamespace(
        rehydration=SimpleNamespace(max_rounds=2, tool_name=TOOL)))
    rehydrations: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 0
    name: str = TOOL

    def is_call(self, call: dict[str, Any]) -> bool:
        return ((call.get("function") or {}).get("name") if "function" in call else call.get("name")) == TOOL

    def answer(self, call: dict[str, Any]) -> str:
        return "TOTAL DUE: 7"


RELAYS: dict[str, Callable[[], list[list[dict[str, Any]]]]] = {
    "chat": chat_rounds, "messages": messages_rounds, "responses": responses_rounds}


def relay_for(kind: str) -> tuple[Any, ScriptedUpstream]:
    upstream = ScriptedUpstream(RELAYS[kind]())
    request = UpstreamRequest(alias="m", litellm_params={"model": "openai/m"}, request_id="req_1",
                              body={"messages": [{"role": "user", "content": "the total?"}], "input": []},
                              timeout_seconds=10)
    neutral = NeutralRequest(model="m", messages=[], stream=True)
    exchange = Exchange(dialect=DIALECTS[kind], request=request, rehydrator=StubRehydrator(),  # type: ignore[arg-type]
                        client=neutral)
    return Relay(upstream, exchange), upstream  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", list(RELAYS))
def test_every_round_is_closed_the_hidden_one_at_its_end(kind: str) -> None:
    async def relayed() -> tuple[str, ScriptedUpstream]:
        relay, upstream = relay_for(kind)
        await relay.start()
        frames = b"".join([frame async for frame in relay.events()])
        assert upstream.closed == [0, 1]  # while the loop runs: closed by the relay, not at the loop's end
        return frames.decode(), upstream

    frames, upstream = asyncio.run(relayed())
    assert "is 7" in frames and TOOL not in frames  # the hidden round was hidden
    assert upstream.closed_before == [[], [0]]  # the hidden round closed before the next one opened


@pytest.mark.parametrize("kind", list(RELAYS))
def test_a_reader_that_stops_mid_round_closes_the_round_under_way(kind: str) -> None:
    async def stopped() -> ScriptedUpstream:
        relay, upstream = relay_for(kind)
        await relay.start()
        events = relay.events()
        async for frame in events:
            if b"the total" in frame:  # the second round's first text
                break
        assert upstream.closed == [0]
        await events.aclose()  # what the response does when its client goes
        assert upstream.closed == [0, 1]
        return upstream

    asyncio.run(stopped())


@pytest.mark.parametrize("kind", list(RELAYS))
def test_a_first_round_never_read_is_closed(kind: str) -> None:
    async def never_read() -> None:
        relay, upstream = relay_for(kind)
        await relay.start()
        await relay.aclose()
        assert upstream.opened == 1 and upstream.closed == [0]

    asyncio.run(never_read())
