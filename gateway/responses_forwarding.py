"""Calling the upstream for one Responses request, hidden rehydration rounds included.

As for Chat (gateway/forwarding.py): when the model calls the gateway's tool,
the gateway answers, adds the round's items and its answers to the input, and
asks again, up to the policy's bound; the client receives one response. JSON:
the final response, the gateway's `function_call` items removed, usage summed.
Stream: one `response.created`, the output items of every round numbered as
one response (text and reasoning stream through as they arrive; function call
items are held until the round ends, because a round that calls the gateway's
tool is dropped whole, client calls included), events renumbered, and one
`response.completed` with the whole output and the summed usage. The response
id is the gateway's (`resp_` and the request id's hex), which
`previous_response_id` and `GET /v1/responses/{id}` resolve.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

from gateway.errors import GatewayError, UpstreamInvalidResponse
from gateway.forwarding import Completion, Conversation, FirstRound
from gateway.rehydration import Rehydrator
from gateway.upstream import UpstreamClient, closing
from gateway.wire import NeutralRequest
from gateway.wire.openai_responses import error_event, sse

_TERMINAL = ("response.completed", "response.failed", "response.incomplete")


def response_id_for(request_id: str) -> str:
    return f"resp_{request_id.removeprefix('req_')}"


def request_id_for(response_id: str) -> str | None:
    hexa = response_id.removeprefix("resp_")
    return f"req_{hexa}" if response_id.startswith("resp_") and len(hexa) == 32 else None


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return total
    out = dict(total or {})
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        out[key] = (out.get(key) or 0) + (usage.get(key) or 0)
    cached = ((out.get("input_tokens_details") or {}).get("cached_tokens") or 0) + (
        (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    out["input_tokens_details"] = {**(out.get("input_tokens_details") or {}), "cached_tokens": cached}
    return out


def chat_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    return {"prompt_tokens": usage.get("input_tokens") or 0, "completion_tokens": usage.get("output_tokens") or 0,
            "total_tokens": usage.get("total_tokens") or 0,
            "prompt_tokens_details": {"cached_tokens": (usage.get("input_tokens_details") or {}).get("cached_tokens")}}


def _gateway_calls(output: list[dict[str, Any]], rehydrator: Rehydrator | None) -> list[dict[str, Any]]:
    if rehydrator is None:
        return []
    return [i for i in output if i.get("type") == "function_call" and i.get("name") == rehydrator.name]


def _hidden_round(output: list[dict[str, Any]], calls: list[dict[str, Any]], answers: list[str]) -> list[dict[str, Any]]:
    """The round's items (its gateway calls only: a client call would stand unanswered) and the answers."""
    ids = {c["call_id"] for c in calls}
    kept = [i for i in output if i.get("type") not in ("function_call", "custom_tool_call") or i.get("call_id") in ids]
    return [*kept, *({"type": "function_call_output", "call_id": c["call_id"], "output": a}
                     for c, a in zip(calls, answers))]


def _as_call(item: dict[str, Any]) -> dict[str, Any]:
    """A function_call item in the shape the rehydrator reads (a Chat call)."""
    return {"id": item.get("call_id"), "function": {"name": item.get("name"), "arguments": item.get("arguments")}}


async def _answer_round(conversation: Conversation, output: list[dict[str, Any]],
                        calls: list[dict[str, Any]]) -> None:
    """Answer the round's gateway calls and add the round and its answers to the upstream input."""
    answers = await conversation.answer([_as_call(c) for c in calls])
    conversation.extend(*_hidden_round(output, calls, answers), field="input")


def _as_clients(response: dict[str, Any], response_id: str, conversation: Conversation) -> dict[str, Any]:
    """The response as the client's: the gateway's id and tool out of it, the client's store flag in."""
    out = {**response, "id": response_id, "store": conversation.client_store}
    if conversation.rehydrator is not None and isinstance(response.get("tools"), list):
        out["tools"] = [t for t in response["tools"] if t.get("name") != conversation.rehydrator.name]
    return out


async def complete(upstream: UpstreamClient, conversation: Conversation) -> Completion:
    response_id = response_id_for(conversation.request.request_id)
    total: dict[str, Any] | None = None
    while True:
        response = await upstream.responses(conversation.request)
        total = add_usage(total, response.get("usage"))
        output = list(response.get("output") or [])
        calls = _gateway_calls(output, conversation.rehydrator)
        if calls and conversation.more_rounds_allowed():
            await _answer_round(conversation, output, calls)
            continue
        final = _as_clients({**response, "output": [i for i in output if i not in calls],
                             "usage": total or response.get("usage")}, response_id, conversation)
        return Completion(body=final, usage=chat_usage(final["usage"]), finish_reason=final.get("status"))


class ResponsesRelay:
    """Responses events for the client: hidden rounds removed, output re-indexed, events renumbered."""

    def __init__(self, upstream: UpstreamClient, conversation: Conversation, request: NeutralRequest) -> None:
        self.upstream = upstream
        self.conversation = conversation
        self.response_id = response_id_for(conversation.request.request_id)
        self.response: dict[str, Any] = {}
        self.output: list[dict[str, Any]] = []
        self.usage: dict[str, Any] | None = None
        self._sequence = 0
        self._first = FirstRound(upstream.stream_responses(conversation.request))
        self._terminal: dict[str, Any] | None = None

    async def start(self) -> None:
        await self._first.open()

    def _emit(self, event: dict[str, Any]) -> bytes:
        event = {**event, "sequence_number": self._sequence}
        self._sequence += 1
        return sse(event)

    def _ours(self, response: dict[str, Any]) -> dict[str, Any]:
        return _as_clients(response, self.response_id, self.conversation)

    async def events(self) -> AsyncIterator[bytes]:
        events: AsyncIterator[dict[str, Any]] = self._first
        first = True
        while True:
            offset = len(self.output)
            shown: dict[int, int] = {}
            held: dict[int, list[dict[str, Any]]] = {}
            items: dict[int, dict[str, Any]] = {}
            terminal: dict[str, Any] | None = None
            async with closing(events):  # the round's stream, also when it ends early
                async for event in events:
                    kind = event.get("type")
                    if kind in ("response.created", "response.in_progress", "response.queued"):
                        if first:
                            self.response = self._ours(event.get("response") or {})
                            yield self._emit({**event, "response": self.response})
                        continue
                    if kind in _TERMINAL:
                        terminal = event
                        break
                    index = event.get("output_index")
                    if index is None:
                        yield self._emit(event)
                        continue
                    item_type = (event.get("item") or {}).get("type")
                    if kind == "response.output_item.added" and item_type == "function_call":
                        held[index] = []
                    if kind == "response.output_item.done":
                        items[index] = event.get("item") or {}
                    if index in held:
                        held[index].append(event)
                        continue
                    if index not in shown:
                        shown[index] = offset + len(shown)
                    yield self._emit({**event, "output_index": shown[index]})
            if terminal is None:
                raise UpstreamInvalidResponse("upstream: the stream ended before response.completed")
            response = terminal.get("response") or {}
            self.usage = add_usage(self.usage, response.get("usage"))
            output = [items[i] for i in sorted(items)] or list(response.get("output") or [])
            calls = _gateway_calls(output, self.conversation.rehydrator)
            self.output += [items.get(i, {}) for i in sorted(shown)]
            if calls and self.conversation.more_rounds_allowed() and terminal.get("type") == "response.completed":
                await _answer_round(self.conversation, output, calls)
                events = self.upstream.stream_responses(self.conversation.request)
                first = False
                continue
            call_ids = {c.get("call_id") for c in calls}
            for index in sorted(held):
                item = items.get(index) or {}
                if item.get("call_id") in call_ids:
                    continue  # past the round bound: the gateway's call is not the client's
                new = len(self.output)
                self.output.append(item)
                for event in held[index]:
                    yield self._emit({**event, "output_index": new})
            self.response = self._ours({**response, "output": self.output, "usage": self.usage})
            self._terminal = {**terminal, "response": self.response}
            return

    @property
    def completion(self) -> Completion:
        return Completion(body=self.response, usage=chat_usage(self.usage), finish_reason=self.response.get("status"))

    def terminal(self) -> bytes:
        assert self._terminal is not None
        return self._emit(self._terminal)

    def error(self, error: GatewayError) -> bytes:
        """The `error` event that ends the stream, numbered after the events before it."""
        return self._emit(error_event(error))

    async def aclose(self) -> None:
        await self._first.aclose()
