"""Calling the upstream for one Anthropic Messages request, hidden rehydration rounds included.

As for Chat (gateway/forwarding.py): a round whose answer calls the gateway's
tool is answered here and the model asked again, up to the policy's bound; the
client receives one message. JSON: the final message, gateway `tool_use`
blocks removed, usage summed. Stream: one `message_start`, the content blocks
of every round re-indexed as one message (text and thinking stream through as
they arrive; `tool_use` blocks are held until the round ends, because a round
that calls the gateway's tool is dropped whole, client calls included), one
`message_delta` with the final stop reason and the summed usage, and
`message_stop`.
"""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

from gateway.errors import GatewayError, UpstreamInvalidResponse
from gateway.forwarding import Completion, Conversation, FirstRound
from gateway.rehydration import Rehydrator
from gateway.upstream import UpstreamClient, closing
from gateway.wire import NeutralRequest
from gateway.wire.anthropic_messages import ANTHROPIC_MESSAGES, sse

_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return total
    out = dict(total or {})
    for key in _USAGE_KEYS:
        if isinstance(usage.get(key), int):
            out[key] = (out.get(key) or 0) + usage[key]
    return out


def chat_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Anthropic usage as the run records it: prompt tokens include the cached and the cache-written."""
    if not usage:
        return None
    fresh, read = usage.get("input_tokens") or 0, usage.get("cache_read_input_tokens") or 0
    written, output = usage.get("cache_creation_input_tokens") or 0, usage.get("output_tokens") or 0
    return {"prompt_tokens": fresh + read + written, "completion_tokens": output,
            "total_tokens": fresh + read + written + output, "prompt_tokens_details": {"cached_tokens": read},
            "cache_creation_input_tokens": written}


def _hidden_round(blocks: list[dict[str, Any]], calls: list[dict[str, Any]],
                  answers: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The assistant turn (its gateway calls only) and the user turn that answers them."""
    ids = {c["id"] for c in calls}
    assistant = {"role": "assistant",
                 "content": [b for b in blocks if b.get("type") != "tool_use" or b.get("id") in ids]}
    results = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c["id"], "content": a}
                                           for c, a in zip(calls, answers)]}
    return assistant, results


def _gateway_calls(blocks: list[dict[str, Any]], rehydrator: Rehydrator | None) -> list[dict[str, Any]]:
    if rehydrator is None:
        return []
    return [b for b in blocks if b.get("type") == "tool_use" and rehydrator.is_call(b)]


def _final_stop(stop: str | None, blocks: list[dict[str, Any]]) -> str | None:
    """A tool_use stop with no client call left is the end of the turn."""
    if stop == "tool_use" and not any(b.get("type") == "tool_use" for b in blocks):
        return "end_turn"
    return stop


async def complete(upstream: UpstreamClient, conversation: Conversation) -> Completion:
    total: dict[str, Any] | None = None
    while True:
        response = await upstream.messages(conversation.request)
        total = add_usage(total, response.get("usage"))
        blocks = list(response.get("content") or [])
        calls = _gateway_calls(blocks, conversation.rehydrator)
        if calls and conversation.more_rounds_allowed():
            conversation.extend(*_hidden_round(blocks, calls, await conversation.answer(calls)))
            continue
        kept = [b for b in blocks if b not in calls]
        stop = _final_stop(response.get("stop_reason"), kept) if calls else response.get("stop_reason")
        final = {**response, "content": kept, "stop_reason": stop, "usage": total or response.get("usage")}
        return Completion(body=final, usage=chat_usage(final["usage"]), finish_reason=stop)


class _Round:
    """One upstream round's blocks, as they accumulate from events."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, str] = {}

    def start(self, index: int, block: dict[str, Any]) -> None:
        self.blocks[index] = dict(block)

    def delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self.blocks.setdefault(index, {})
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta.get("text", "")
        elif kind == "input_json_delta":
            self.partial_json[index] = self.partial_json.get(index, "") + delta.get("partial_json", "")
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta.get("signature", "")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def finished(self) -> list[dict[str, Any]]:
        for index, raw in self.partial_json.items():
            try:
                self.blocks[index]["input"] = json.loads(raw) if raw else {}
            except ValueError:
                self.blocks[index]["input"] = {}
        return [self.blocks[i] for i in sorted(self.blocks)]


class MessagesRelay:
    """Anthropic events for the client: hidden rounds removed, blocks re-indexed, usage summed."""

    def __init__(self, upstream: UpstreamClient, conversation: Conversation, request: NeutralRequest) -> None:
        self.upstream = upstream
        self.conversation = conversation
        self.message: dict[str, Any] = {}
        self.visible: list[dict[str, Any]] = []  # the client's message, block by block
        self.usage: dict[str, Any] | None = None
        self.stop_reason: str | None = None
        self._first = FirstRound(upstream.stream_messages(conversation.request))
        self._next_index = 0

    async def start(self) -> None:
        await self._first.open()

    def _index(self) -> int:
        self._next_index += 1
        return self._next_index - 1

    async def events(self) -> AsyncIterator[bytes]:
        events: AsyncIterator[dict[str, Any]] = self._first
        first = True
        while True:
            current = _Round()
            shown: dict[int, int] = {}  # upstream index -> client index, for blocks passed on at once
            held: dict[int, list[dict[str, Any]]] = {}  # tool_use blocks, until the round ends
            delta: dict[str, Any] = {}
            usage: dict[str, Any] = {}  # this round's: message_start's, overridden by message_delta's final counts
            stopped = False
            async with closing(events):  # the round's stream, also when it ends early
                async for event in events:
                    kind = event.get("type")
                    if kind == "message_start":
                        started = (event.get("message") or {}).get("usage") or {}
                        usage.update({k: v for k, v in started.items() if k != "output_tokens"})
                        if first:
                            self.message = dict(event.get("message") or {})
                            yield sse(event)
                    elif kind == "ping":
                        yield sse(event)
                    elif kind == "content_block_start":
                        index, block = event["index"], event.get("content_block") or {}
                        current.start(index, block)
                        if block.get("type") == "tool_use":
                            held[index] = [event]
                        else:
                            shown[index] = self._index()
                            yield sse({**event, "index": shown[index]})
                    elif kind in ("content_block_delta", "content_block_stop"):
                        index = event["index"]
                        if kind == "content_block_delta":
                            current.delta(index, event.get("delta") or {})
                        if index in held:
                            held[index].append(event)
                        else:
                            if index not in shown:  # a delta without its start: still one block for the client
                                shown[index] = self._index()
                            yield sse({**event, "index": shown[index]})
                    elif kind == "message_delta":
                        delta = event
                        usage.update(event.get("usage") or {})
                    elif kind == "message_stop":
                        stopped = True
                        break
            if not stopped:
                raise UpstreamInvalidResponse("upstream: the stream ended before message_stop")
            self.usage = add_usage(self.usage, usage)
            blocks = current.finished()
            calls = _gateway_calls(blocks, self.conversation.rehydrator)
            by_index = dict(zip(sorted(current.blocks), blocks))
            self.visible += [by_index[i] for i in sorted(shown)]
            if calls and self.conversation.more_rounds_allowed():
                self.conversation.extend(*_hidden_round(blocks, calls, await self.conversation.answer(calls)))
                events = self.upstream.stream_messages(self.conversation.request)
                first = False
                continue
            for index in sorted(held):
                if by_index[index] in calls:
                    continue  # past the round bound: the gateway's call is not the client's
                new = self._index()
                self.visible.append(by_index[index])
                for event in held[index]:
                    yield sse({**event, "index": new})
            stop = (delta.get("delta") or {}).get("stop_reason")
            self.stop_reason = _final_stop(stop, self.visible) if calls else stop
            yield sse({"type": "message_delta", "delta": {**(delta.get("delta") or {}), "stop_reason": self.stop_reason},
                       "usage": self.usage or {}})
            return

    @property
    def completion(self) -> Completion:
        body = {**self.message, "content": self.visible, "stop_reason": self.stop_reason, "usage": self.usage}
        return Completion(body=body, usage=chat_usage(self.usage), finish_reason=self.stop_reason)

    def terminal(self) -> bytes:
        return sse({"type": "message_stop"})

    def error(self, error: GatewayError) -> bytes:
        return ANTHROPIC_MESSAGES.stream_error(error)

    async def aclose(self) -> None:
        await self._first.aclose()
