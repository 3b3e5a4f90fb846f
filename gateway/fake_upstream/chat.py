"""The Chat Completions side of the fake upstream: `POST /v1/chat/completions`.

Answers the next step (gateway/fake_upstream/state.py) as a chat completion, or
as real SSE chunks with content and tool-call arguments split across them as
providers do. Usage reports a prefix cache: `cached_tokens` is the longest run of
messages shared with an earlier request.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.fake_upstream.responses import cached_prefix
from gateway.fake_upstream.state import FakeState, Step, scripted_failure


def _message_tokens(message: dict[str, Any]) -> int:
    return max(1, len(json.dumps(message, sort_keys=True)) // 4)


def _usage(body: dict[str, Any], step: Step, earlier: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Usage as a provider with a prefix cache reports it: cached = the longest message
    prefix shared with an earlier request (the gateway's accounting relies on it)."""
    if step.usage is not None:
        return step.usage
    messages = body.get("messages", [])
    prompt = sum(_message_tokens(m) for m in messages)
    cached = cached_prefix(earlier, messages, _message_tokens)
    return {"prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _chunks(base: dict[str, Any], message: dict[str, Any], finish: str) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    out = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content") or ""
    for i in range(0, len(text), 16):
        out.append(chunk({"content": text[i : i + 16]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        out.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                          "function": {"name": function["name"], "arguments": ""}}]}))
        arguments = function.get("arguments") or ""
        for i in range(0, len(arguments), 24):
            out.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[i : i + 24]}}]}))
    out.append(chunk({}, finish))
    return out


def add_chat_routes(app: FastAPI, state: FakeState) -> None:
    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        with state.lock:
            earlier = [r["body"].get("messages", []) for r in state.requests]
            number = state.record(request, body)
        step = state.answer(body, state.chat_responder)
        if (failure := await scripted_failure(step)) is not None:
            return failure
        message = dict(step.message or {"role": "assistant", "content": "ok"})
        message.setdefault("role", "assistant")
        message.setdefault("content", None)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        usage = _usage(body, step, earlier)
        base = {"id": f"chatcmpl-fake-{number}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": body.get("model", "fake"),
                "system_fingerprint": "fp_fake"}
        if not body.get("stream"):
            return JSONResponse({**base, "object": "chat.completion",
                                 "choices": [{"index": 0, "message": message, "finish_reason": finish,
                                              "logprobs": None}],
                                 "usage": usage})

        async def events() -> Any:
            chunks = _chunks(base, message, finish)
            if (body.get("stream_options") or {}).get("include_usage"):
                chunks.append({**base, "choices": [], "usage": usage})
            for sent, payload in enumerate(chunks):
                if step.break_stream_after is not None and sent >= step.break_stream_after:
                    raise RuntimeError("scripted broken stream")
                yield _sse(payload)
                await asyncio.sleep(step.chunk_delay)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")
