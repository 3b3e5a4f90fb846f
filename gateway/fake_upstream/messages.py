"""The Anthropic Messages side of the fake upstream: `POST /v1/messages` and `/v1/messages/count_tokens`.

Answers the next scripted step (gateway/fake_upstream/state.py's `Step`) as an
Anthropic message: `blocks` as given (text, tool_use, thinking with its
signature, ...), or built from the step's OpenAI-style `message`. Streams the
real event sequence (message_start, ping, content_block_start/delta/stop,
message_delta, message_stop) with text, tool input JSON, thinking and
signatures split across deltas. Errors come in Anthropic's shape.

Usage simulates Anthropic's prompt cache: only prefixes that end at a
`cache_control` marker are written. A request reads the longest prefix an
earlier request wrote that ends at one of its markers or within the 20 blocks
before one (Anthropic's lookback), writes the rest up to its last marker, and
pays full price for what follows (`input_tokens`), as the provider reports it.
A request's `context_management` edits (gateway/fake_upstream/context_edits.py) run first: the cache
and the counts are those of the edited prompt, and the edits applied come back as Anthropic reports them.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.fake_upstream import context_edits
from gateway.fake_upstream.state import FakeState, Step, scripted_failure


def block_tokens(block: Any) -> int:
    """A stable stand-in for a tokenizer: a quarter of the JSON length."""
    return max(1, len(json.dumps(block, sort_keys=True)) // 4)


def prompt_blocks(body: dict[str, Any]) -> list[Any]:
    """The prompt in Anthropic's cache order: tools, system, then every message's blocks."""
    out: list[Any] = list(body.get("tools") or [])
    system = body.get("system")
    if isinstance(system, str):
        out.append({"type": "text", "text": system})
    elif isinstance(system, list):
        out += system
    for message in body.get("messages") or []:
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        out += [{"role": message.get("role"), **b} if isinstance(b, dict) else b for b in blocks]
    return out


def _digest(blocks: list[Any]) -> str:
    stripped = [{k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b for b in blocks]
    return hashlib.sha256(json.dumps(stripped, sort_keys=True).encode()).hexdigest()


LOOKBACK = 20  # Anthropic checks for a hit at each of the ~20 block boundaries before a marker


def cache_usage(body: dict[str, Any], written: set[str]) -> dict[str, int]:
    """input, cache read and cache creation tokens for `body`, given the prefixes written before."""
    blocks = prompt_blocks(body)
    tokens = [block_tokens({k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b)
              for b in blocks]
    marks = [i for i, b in enumerate(blocks) if isinstance(b, dict) and b.get("cache_control")][-4:]
    total = sum(tokens)
    read_to = 0
    for mark in marks:
        for end in range(mark, max(-1, mark - LOOKBACK), -1):
            if end + 1 > read_to and _digest(blocks[: end + 1]) in written:
                read_to = end + 1
                break
    write_to = marks[-1] + 1 if marks and marks[-1] + 1 > read_to else read_to
    for mark in marks:
        written.add(_digest(blocks[: mark + 1]))
    read = sum(tokens[:read_to])
    creation = sum(tokens[read_to:write_to])
    return {"input_tokens": total - read - creation, "cache_read_input_tokens": read,
            "cache_creation_input_tokens": creation}


TOOL_CHANGE_BETAS = ("mid-conversation-tool-changes-2026-07-01", "inline-tools-2026-09-15")


def tool_change_refusal(body: dict[str, Any], betas: str, supported: bool) -> str | None:
    """Why Anthropic would refuse the request's mid-conversation tool additions (None: it takes them):
    the model lacks the feature, the betas are missing, or an addition splits a tool_use turn from its
    tool_result turn."""
    messages = body.get("messages") or []
    for index, message in enumerate(messages):
        blocks = message.get("content") if isinstance(message.get("content"), list) else []
        if not any(isinstance(b, dict) and b.get("type") == "tool_addition" for b in blocks):
            continue
        if not supported:
            return f"messages.{index}: mid-conversation tool changes are not supported for this model"
        given = {b.strip() for b in betas.split(",")}
        if missing := [b for b in TOOL_CHANGE_BETAS if b not in given]:
            return f"messages.{index}: tool_addition requires the anthropic-beta {', '.join(missing)}"
        if message.get("role") != "system":
            return f"messages.{index}: tool_addition blocks belong in a system message"
        before = messages[index - 1] if index else {}
        if before.get("role") == "assistant" and any(
                isinstance(b, dict) and b.get("type") == "tool_use" for b in before.get("content") or []):
            return f"messages.{index}: tool_use ids were found without tool_result blocks immediately after"
        if index == len(messages) - 1:
            return f"messages.{index}: the last message must be a user or assistant turn"
    return None


def blocks_for(step: Step) -> list[dict[str, Any]]:
    if step.blocks is not None:
        return step.blocks
    message = step.message or {"role": "assistant", "content": "ok"}
    blocks: list[dict[str, Any]] = []
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": json.loads(call["function"].get("arguments") or "{}")})
    return blocks


def _event(name: str, payload: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n"


def _block_events(index: int, block: dict[str, Any]) -> list[str]:
    kind = block.get("type")
    if kind == "text":
        start = {"type": "text", "text": ""}
        text = block.get("text") or ""
        deltas = [{"type": "text_delta", "text": text[i : i + 16]} for i in range(0, len(text), 16)]
    elif kind == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        raw = json.dumps(block.get("input") or {})
        deltas = [{"type": "input_json_delta", "partial_json": raw[i : i + 24]} for i in range(0, len(raw), 24)]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        text = block.get("thinking") or ""
        deltas = [{"type": "thinking_delta", "thinking": text[i : i + 20]} for i in range(0, len(text), 20)]
        deltas.append({"type": "signature_delta", "signature": block.get("signature") or ""})
    elif kind == "compaction":  # its summary in one compaction_delta, as Anthropic streams it
        start = {"type": "compaction", "content": None}
        summary = {k: v for k, v in block.items() if k in ("content", "encrypted_content")}
        deltas = [{"type": "compaction_delta", **summary}]
    else:  # redacted_thinking, server tool blocks: whole at the start
        start, deltas = block, []
    events = [_event("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})]
    events += [_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
               for d in deltas]
    events.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def add_messages_routes(app: FastAPI, state: FakeState) -> None:
    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> dict[str, int]:
        body = await request.json()
        with state.lock:
            state.record(request, body, "/v1/messages/count_tokens")
        return {"input_tokens": sum(block_tokens(b) for b in prompt_blocks(body))}

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        body = await request.json()
        with state.lock:
            number = state.record(request, body, "/v1/messages")
            betas = request.headers.get("anthropic-beta", "")
            refusal = tool_change_refusal(body, betas, state.tool_changes) or context_edits.refusal(body, betas)
            if refusal is None:
                edited, applied = context_edits.apply_edits(
                    body, block_tokens, lambda b: sum(block_tokens(x) for x in prompt_blocks(b)))
                usage = cache_usage(edited, state.anthropic_cache)
        if refusal is not None:
            return JSONResponse({"type": "error", "error": {"type": "invalid_request_error", "message": refusal}},
                                status_code=400)
        step = state.answer(body, state.responder)
        if (failure := await scripted_failure(step, anthropic=True)) is not None:
            return failure
        blocks = blocks_for(step)
        stop = step.stop_reason or ("tool_use" if any(b.get("type") == "tool_use" for b in blocks) else "end_turn")
        usage = {**usage, "output_tokens": 7, **(step.usage or {})}
        message = {"id": f"msg_fake_{number}", "type": "message", "role": "assistant",
                   "model": body.get("model", "fake"), "content": blocks, "stop_reason": stop,
                   "stop_sequence": None, "usage": usage}
        managed = {"context_management": {"applied_edits": applied}} if applied is not None else {}
        message.update(managed)
        if not body.get("stream"):
            return JSONResponse(message)

        async def events() -> Any:
            start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
            start.pop("context_management", None)  # told at the end, on message_delta
            out = [_event("message_start", {"type": "message_start", "message": start}),
                   _event("ping", {"type": "ping"})]
            for index, block in enumerate(blocks):
                out += _block_events(index, block)
            out.append(_event("message_delta", {"type": "message_delta",
                                                "delta": {"stop_reason": stop, "stop_sequence": None},
                                                "usage": {"output_tokens": usage["output_tokens"]}, **managed}))
            out.append(_event("message_stop", {"type": "message_stop"}))
            for sent, payload in enumerate(out):
                if step.break_stream_after is not None and sent >= step.break_stream_after:
                    raise RuntimeError("scripted broken stream")
                yield payload
                await asyncio.sleep(step.chunk_delay)

        return StreamingResponse(events(), media_type="text/event-stream")
