"""The Responses side of the fake upstream: `POST /v1/responses` (and `/v1/embeddings`, `/v1/completions`).

Answers the next scripted step (gateway/fake_upstream/state.py's `Step`) as a Responses
object: `items` as given (message, function_call, reasoning with its
encrypted_content, ...), or built from the step's OpenAI-style `message`.
Streams the real event sequence (response.created, response.in_progress,
response.output_item.added, response.content_part.added,
response.output_text.delta/done, response.function_call_arguments.delta/done,
response.output_item.done, response.completed), numbered. Usage reports a
prefix cache: `cached_tokens` is the longest run of input items shared with an
earlier request.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.fake_upstream.compaction import expanded
from gateway.fake_upstream.state import FakeState, Step, scripted_failure


def _tokens(value: Any) -> int:
    return max(1, len(json.dumps(value, sort_keys=True)) // 4)


def input_items(body: dict[str, Any]) -> list[Any]:
    items = body.get("input")
    if isinstance(items, str):
        return [{"type": "message", "role": "user", "content": items}]
    return list(items or [])


def cached_prefix(earlier: list[list[Any]], items: list[Any], tokens: Any) -> int:
    """The tokens of the longest run of `items` an earlier request (of the last 50) began with."""
    cached = 0
    for previous in earlier[-50:]:
        shared = 0
        for a, b in zip(previous, items):
            if a != b:
                break
            shared += tokens(b)
        cached = max(cached, shared)
    return cached


def usage_for(body: dict[str, Any], earlier: list[list[Any]]) -> dict[str, Any]:
    items = ([{"instructions": body.get("instructions")}] if body.get("instructions") else []) + input_items(body)
    prompt = sum(_tokens(i) for i in items) + sum(_tokens(t) for t in body.get("tools") or [])
    cached = cached_prefix(earlier, items, _tokens)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": 7,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + 7}


def items_for(step: Step, number: int) -> list[dict[str, Any]]:
    if step.items is not None:
        return step.items
    message = step.message or {"role": "assistant", "content": "ok"}
    out: list[dict[str, Any]] = []
    if message.get("content"):
        out.append({"type": "message", "id": f"msg_fake_{number}", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})
    for index, call in enumerate(message.get("tool_calls") or []):
        out.append({"type": "function_call", "id": f"fc_fake_{number}_{index}", "call_id": call["id"],
                    "name": call["function"]["name"], "arguments": call["function"].get("arguments") or "{}",
                    "status": "completed"})
    return out


def _events(response: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events = [("response.created", {"response": started}), ("response.in_progress", {"response": started})]
    for index, item in enumerate(response["output"]):
        kind = item.get("type")
        if kind == "message":
            opened = {**item, "status": "in_progress", "content": []}
            events.append(("response.output_item.added", {"output_index": index, "item": opened}))
            for part_index, part in enumerate(item.get("content") or []):
                text = part.get("text", "")
                base = {"item_id": item["id"], "output_index": index, "content_index": part_index}
                events.append(("response.content_part.added", {**base, "part": {**part, "text": ""}}))
                for start in range(0, len(text), 16):
                    events.append(("response.output_text.delta", {**base, "delta": text[start : start + 16]}))
                events.append(("response.output_text.done", {**base, "text": text}))
                events.append(("response.content_part.done", {**base, "part": part}))
        elif kind == "function_call":
            events.append(("response.output_item.added",
                           {"output_index": index, "item": {**item, "arguments": "", "status": "in_progress"}}))
            arguments = item.get("arguments", "")
            for start in range(0, len(arguments), 24):
                events.append(("response.function_call_arguments.delta",
                               {"item_id": item["id"], "output_index": index, "delta": arguments[start : start + 24]}))
            events.append(("response.function_call_arguments.done",
                           {"item_id": item["id"], "output_index": index, "arguments": arguments}))
        else:
            events.append(("response.output_item.added", {"output_index": index, "item": item}))
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    events.append(("response.completed", {"response": response}))
    return events


def add_responses_routes(app: FastAPI, state: FakeState) -> None:
    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        body = await request.json()
        with state.lock:
            earlier = [([{"instructions": r["body"].get("instructions")}] if r["body"].get("instructions") else [])
                       + input_items(r["body"]) for r in state.requests if r.get("path") == "/v1/responses"]
            number = state.record(request, body, "/v1/responses")
        step = state.answer(expanded(state, body), state.responses_responder)
        if (failure := await scripted_failure(step)) is not None:
            return failure
        response = {"id": f"resp_fake_{number}", "object": "response", "created_at": int(time.time()),
                    "status": "completed", "model": body.get("model", "fake"), "output": items_for(step, number),
                    "usage": step.usage or usage_for(body, earlier), "parallel_tool_calls": True,
                    "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
                    "instructions": body.get("instructions"), "error": None, "incomplete_details": None,
                    "metadata": body.get("metadata") or {}, "text": {"format": {"type": "text"}}}
        if not body.get("stream"):
            return JSONResponse(response)

        async def events() -> Any:
            for sequence, (kind, payload) in enumerate(_events(response)):
                if step.break_stream_after is not None and sequence >= step.break_stream_after:
                    raise RuntimeError("scripted broken stream")
                yield f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': sequence, **payload})}\n\n"
                await asyncio.sleep(step.chunk_delay)

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> dict[str, Any]:
        body = await request.json()
        with state.lock:
            state.record(request, body, "/v1/embeddings")
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else list(texts or [])
        data = [{"object": "embedding", "index": i, "embedding": [round((len(str(t)) % 7) * 0.1 + k * 0.01, 4)
                                                                   for k in range(8)]} for i, t in enumerate(texts)]
        tokens = sum(_tokens(t) for t in texts)
        return {"object": "list", "data": data, "model": body.get("model", "fake-embed"),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        with state.lock:
            number = state.record(request, body, "/v1/completions")
        step = state.next_step()
        if step.delay:
            await asyncio.sleep(step.delay)
        if step.status != 200:
            return JSONResponse({"error": step.error or {"message": "scripted", "type": "api_error"}},
                                status_code=step.status)
        text = (step.message or {}).get("content") or " completed text"
        prompt = _tokens(body.get("prompt"))
        base = {"id": f"cmpl-fake-{number}", "object": "text_completion", "created": int(time.time()),
                "model": body.get("model", "fake")}
        usage = {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3}
        if not body.get("stream"):
            return {**base, "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
                    "usage": usage}

        async def chunks() -> Any:
            for sent, start in enumerate(range(0, len(text), 5)):
                if step.break_stream_after is not None and sent >= step.break_stream_after:
                    raise RuntimeError("scripted broken stream")
                piece = {**base, "choices": [{"index": 0, "text": text[start : start + 5], "finish_reason": None,
                                              "logprobs": None}]}
                yield f"data: {json.dumps(piece)}\n\n"
                await asyncio.sleep(step.chunk_delay)
            yield f"data: {json.dumps({**base, 'choices': [{'index': 0, 'text': '', 'finish_reason': 'stop', 'logprobs': None}], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")
