"""The Anthropic Messages dialect of the exchange (gateway/exchange/driver.py runs the rounds).

JSON: the final message, the gateway's `tool_use` blocks removed (a `tool_use`
stop with no client call left becomes `end_turn`), usage summed. Stream: one
`message_start`, the content blocks of every round re-indexed as one message
(text and thinking stream through as they arrive; `tool_use` blocks are held
until the round ends), one `message_delta` with the final stop reason and the
summed usage (and the provider's `context_management`, as the last round's `message_delta` told it),
and `message_stop`. A `compaction` block (Anthropic's server-side compaction) passes as it came. A
message left with no text and no client call once the gateway's calls are out gets a text block with
the exchange's `unanswered` text. The gateway's tool leaves a request from `tools` and, where it was
added mid-conversation (gateway/pipeline/tool_additions.py), from its `tool_addition` message.
"""
from __future__ import annotations

import json
from typing import Any, Iterator

from gateway.errors import GatewayError, UpstreamInvalidResponse
from gateway.exchange.dialect import Answer, Completion, Dialect, GatewayTool
from gateway.exchange.driver import Exchange
from gateway.pipeline.tool_additions import is_addition
from gateway.wire import anthropic_messages as wire
from gateway.wire.anthropic_context import applied_edits
from gateway.wire.anthropic_messages import ANTHROPIC_MESSAGES, run_usage, sse


class MessagesDialect(Dialect):
    api = "messages"
    field = "messages"

    add_usage = staticmethod(wire.add_usage)

    def gateway_calls(self, answer: Answer, tool: GatewayTool) -> list[dict[str, Any]]:
        return [b for b in answer.get("content") or [] if b.get("type") == "tool_use" and tool.is_call(b)]

    def without_tool(self, body: dict[str, Any], name: str) -> dict[str, Any]:
        out = {**body, "messages": _without_addition(body.get("messages") or [], name)}
        if "tools" in body:
            out["tools"] = [t for t in body.get("tools") or [] if not (isinstance(t, dict) and t.get("name") == name)]
            if not out["tools"]:
                out.pop("tools")
                out.pop("tool_choice", None)
        return out

    def hidden_round(self, answer: Answer, calls: list[dict[str, Any]], answers: list[str]) -> list[dict[str, Any]]:
        """The assistant turn (its gateway calls only) and the user turn that answers them."""
        ids = {c["id"] for c in calls}
        assistant = {"role": "assistant", "content": [b for b in answer.get("content") or []
                                                      if b.get("type") != "tool_use" or b.get("id") in ids]}
        results = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c["id"], "content": a}
                                               for c, a in zip(calls, answers)]}
        return [assistant, results]

    def completion(self, answer: Answer, calls: list[dict[str, Any]], usage: dict[str, Any] | None,
                   exchange: Exchange) -> Completion:
        kept = [b for b in answer.get("content") or [] if b not in calls]
        if calls and not _says_anything(kept):
            kept.append({"type": "text", "text": exchange.unanswered()})
        stop = _final_stop(answer.get("stop_reason"), kept) if calls else answer.get("stop_reason")
        final = {**answer, "content": kept, "stop_reason": stop, "usage": usage or answer.get("usage")}
        return Completion(body=final, usage=run_usage(final["usage"]), finish_reason=stop,
                          applied_edits=applied_edits(answer))

    def stream(self, exchange: Exchange) -> "MessagesStream":
        return MessagesStream(exchange)


def _without_addition(messages: list[Any], name: str) -> list[Any]:
    """`messages` without the mid-conversation addition of the tool `name` (a message adding only it goes)."""
    out = []
    for message in messages:
        if not is_addition(message):
            out.append(message)
            continue
        blocks = [b for b in message["content"] if not (isinstance(b, dict) and b.get("type") == "tool_addition"
                                                        and _defined(b) == name)]
        if blocks:
            out.append({**message, "content": blocks})
    return out


def _defined(addition: dict[str, Any]) -> Any:
    """The name of the tool a `tool_addition` block defines."""
    return ((addition.get("tool") or {}).get("definition") or {}).get("name")


def _says_anything(blocks: list[dict[str, Any]]) -> bool:
    return any(b.get("type") == "text" and b.get("text") or b.get("type") in ("tool_use", "server_tool_use")
               for b in blocks)


def _final_stop(stop: str | None, blocks: list[dict[str, Any]]) -> str | None:
    """A tool_use stop with no client call left is the end of the turn."""
    if stop == "tool_use" and not any(b.get("type") == "tool_use" for b in blocks):
        return "end_turn"
    return stop


class MessagesStream:
    """The client's message, block by block, its blocks numbered across rounds."""

    def __init__(self, exchange: Exchange | None = None) -> None:
        self.exchange = exchange
        self.message: dict[str, Any] = {}  # message_start's
        self.visible: list[dict[str, Any]] = []  # the client's blocks
        self.usage: dict[str, Any] | None = None
        self.stop_reason: str | None = None
        self.managed: dict[str, Any] = {}  # the last round's `context_management`, when it told one
        self._next_index = 0

    def index(self) -> int:
        self._next_index += 1
        return self._next_index - 1

    def round(self, first: bool) -> "MessagesRound":
        return MessagesRound(self, first)

    def end(self, last: "MessagesRound", calls: list[dict[str, Any]], usage: dict[str, Any] | None) -> Iterator[bytes]:
        for index in sorted(last.held):
            if last.by_index[index] in calls:
                continue  # past the round bound: the gateway's call is not the client's
            new = self.index()
            self.visible.append(last.by_index[index])
            for event in last.held[index]:
                yield sse({**event, "index": new})
        if calls and self.exchange is not None and not _says_anything(self.visible):
            yield from self._text_block(self.exchange.unanswered())
        delta = last.delta.get("delta") or {}
        self.usage = usage
        self.stop_reason = _final_stop(delta.get("stop_reason"), self.visible) if calls else delta.get("stop_reason")
        if "context_management" in last.delta:
            self.managed = {"context_management": last.delta["context_management"]}
        yield sse({"type": "message_delta", "delta": {**delta, "stop_reason": self.stop_reason}, "usage": usage or {},
                   **self.managed})

    def _text_block(self, text: str) -> Iterator[bytes]:
        """A text block of the gateway's own, streamed as one."""
        index = self.index()
        self.visible.append({"type": "text", "text": text})
        yield sse({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
        yield sse({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}})
        yield sse({"type": "content_block_stop", "index": index})

    @property
    def completion(self) -> Completion:
        body = {**self.message, "content": self.visible, "stop_reason": self.stop_reason, "usage": self.usage,
                **self.managed}
        return Completion(body=body, usage=run_usage(self.usage), finish_reason=self.stop_reason,
                          applied_edits=applied_edits(body))

    def terminal(self) -> bytes:
        return sse({"type": "message_stop"})

    def error(self, error: GatewayError) -> bytes:
        return ANTHROPIC_MESSAGES.stream_error(error)


class MessagesRound:
    """One round's events: blocks re-indexed and passed on, `tool_use` blocks held, usage kept."""

    answered = True

    def __init__(self, stream: MessagesStream, first: bool) -> None:
        self.stream = stream
        self.first = first
        self.blocks = _Blocks()
        self.shown: dict[int, int] = {}  # upstream index -> client index, for blocks passed on at once
        self.held: dict[int, list[dict[str, Any]]] = {}  # tool_use blocks' events, until the round ends
        self.by_index: dict[int, dict[str, Any]] = {}  # the finished blocks
        self.delta: dict[str, Any] = {}  # message_delta
        self.usage: dict[str, Any] = {}  # message_start's, overridden by message_delta's final counts
        self.ended = False

    def read(self, event: dict[str, Any]) -> Iterator[bytes]:
        kind = event.get("type")
        if kind == "message_start":
            started = (event.get("message") or {}).get("usage") or {}
            self.usage.update({k: v for k, v in started.items() if k != "output_tokens"})
            if self.first:
                self.stream.message = dict(event.get("message") or {})
                yield sse(event)
        elif kind == "ping":
            yield sse(event)
        elif kind == "content_block_start":
            index, block = event["index"], event.get("content_block") or {}
            self.blocks.start(index, block)
            if block.get("type") == "tool_use":
                self.held[index] = [event]
            else:
                self.shown[index] = self.stream.index()
                yield sse({**event, "index": self.shown[index]})
        elif kind in ("content_block_delta", "content_block_stop"):
            index = event["index"]
            if kind == "content_block_delta":
                self.blocks.delta(index, event.get("delta") or {})
            if index in self.held:
                self.held[index].append(event)
            else:
                if index not in self.shown:  # a delta without its start: still one block for the client
                    self.shown[index] = self.stream.index()
                yield sse({**event, "index": self.shown[index]})
        elif kind == "message_delta":
            self.delta = event
            self.usage.update(event.get("usage") or {})
        elif kind == "message_stop":
            self.ended = True

    def finish(self) -> Answer:
        if not self.ended:
            raise UpstreamInvalidResponse("upstream: the stream ended before message_stop")
        blocks = self.blocks.finished()
        self.by_index = dict(zip(sorted(self.blocks.blocks), blocks))
        self.stream.visible += [self.by_index[i] for i in sorted(self.shown)]
        return {"content": blocks, "usage": self.usage}


class _Blocks:
    """One round's blocks, as they accumulate from events."""

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
        elif kind == "compaction_delta":  # the summary whole, as Anthropic's SDK reads it
            block.update({k: v for k, v in delta.items() if k in ("content", "encrypted_content")})

    def finished(self) -> list[dict[str, Any]]:
        for index, raw in self.partial_json.items():
            try:
                self.blocks[index]["input"] = json.loads(raw) if raw else {}
            except ValueError:
                self.blocks[index]["input"] = {}
        return [self.blocks[i] for i in sorted(self.blocks)]


MESSAGES = MessagesDialect()
