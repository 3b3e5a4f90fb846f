"""The Gemini side of the fake upstream: `POST /v1beta/models/{model}:{method}`.

`generateContent` answers the next step (gateway/fake_upstream/state.py) as a
GenerateContentResponse: `parts` as given (thought signatures and all), or built
from the step's OpenAI-style message (text, then one `functionCall` per tool call,
without ids, as Gemini models answer). `streamGenerateContent` sends the same
answer in chunks (text split across them, the calls in one, the finish reason and
usage in the last), as server-sent events with `alt=sse`, else as a JSON array.
`countTokens` counts. Errors come in Google's shape.

Usage simulates Gemini's implicit cache: `cachedContentTokenCount` is the longest
prefix (tools, system instruction, then contents) an earlier request began with,
so a projection whose prefix stays byte-stable keeps its cache hits.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gateway.fake_upstream.responses import cached_prefix
from gateway.fake_upstream.state import FakeState, Step, scripted_failure


def _tokens(item: Any) -> int:
    return max(1, len(json.dumps(item, sort_keys=True)) // 4)


def prompt_items(body: dict[str, Any]) -> list[Any]:
    """The prompt in cache order: tools, system instruction, then every content."""
    head = [{"tools": body["tools"]}] if body.get("tools") else []
    if body.get("systemInstruction"):
        head.append({"systemInstruction": body["systemInstruction"]})
    return head + list(body.get("contents") or [])


def usage_for(body: dict[str, Any], earlier: list[list[Any]], step: Step) -> dict[str, Any]:
    if step.usage is not None:
        return step.usage
    items = prompt_items(body)
    prompt = sum(_tokens(i) for i in items)
    cached = cached_prefix(earlier, items, _tokens)
    usage = {"promptTokenCount": prompt, "candidatesTokenCount": 7, "totalTokenCount": prompt + 7}
    return {**usage, "cachedContentTokenCount": cached} if cached else usage


def parts_for(step: Step) -> list[dict[str, Any]]:
    if step.parts is not None:
        return step.parts
    message = step.message or {"role": "assistant", "content": "ok"}
    parts: list[dict[str, Any]] = [{"text": message["content"]}] if message.get("content") else []
    for call in message.get("tool_calls") or []:
        parts.append({"functionCall": {"name": call["function"]["name"],
                                       "args": json.loads(call["function"].get("arguments") or "{}")}})
    return parts


def _chunks(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer as a model streams it: text in pieces, the calls together, the finish and usage last."""
    candidate = answer["candidates"][0]
    parts = candidate["content"]["parts"]
    head = {k: v for k, v in answer.items() if k in ("modelVersion", "responseId")}
    out = []
    for part in parts:
        if set(part) == {"text"} and len(part["text"]) > 16:
            text = part["text"]
            pieces = [text[: len(text) // 2], text[len(text) // 2:]]
            out += [{"candidates": [{"content": {"role": "model", "parts": [{"text": p}]}, "index": 0}], **head}
                    for p in pieces]
        else:
            out.append({"candidates": [{"content": {"role": "model", "parts": [part]}, "index": 0}], **head})
    last = {"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]},
                            "finishReason": candidate["finishReason"], "index": 0}],
            "usageMetadata": answer["usageMetadata"], **head}
    return out + [last]


def _error(status: int, message: str) -> JSONResponse:
    names = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
             503: "UNAVAILABLE"}
    return JSONResponse({"error": {"code": status, "message": message, "status": names.get(status, "UNKNOWN")}},
                        status_code=status)


def add_gemini_routes(app: FastAPI, state: FakeState) -> None:
    @app.post("/v1beta/models/{target}")
    async def gemini(target: str, request: Request) -> Response:
        model, _, method = target.rpartition(":")
        body = await request.json()
        with state.lock:
            earlier = [prompt_items(r["body"]) for r in state.requests if r.get("path", "").startswith("/v1beta/")]
            number = state.record(request, body, f"/v1beta/models/{target}")
        if method == "countTokens":
            inner = body.get("generateContentRequest") or body
            return JSONResponse({"totalTokens": sum(_tokens(i) for i in prompt_items(inner))})
        if method not in ("generateContent", "streamGenerateContent"):
            return _error(404, f"unknown method {method}")
        if not isinstance(body.get("contents"), list) or not body["contents"]:
            return _error(400, "contents is required")
        step = state.answer(body, state.gemini_responder)
        if (failure := await scripted_failure(step, google=True)) is not None:
            return failure
        answer = {"candidates": [{"content": {"role": "model", "parts": parts_for(step)},
                                  "finishReason": step.stop_reason or "STOP", "index": 0}],
                  "usageMetadata": usage_for(body, earlier, step), "modelVersion": model,
                  "responseId": f"fake-gemini-{number}"}
        if method == "generateContent":
            return JSONResponse(answer)
        sse = request.query_params.get("alt") == "sse"

        async def frames() -> Any:
            chunks = _chunks(answer)
            for sent, chunk in enumerate(chunks):
                if step.break_stream_after is not None and sent >= step.break_stream_after:
                    raise RuntimeError("scripted broken stream")
                text = json.dumps(chunk)
                yield f"data: {text}\r\n\r\n" if sse else ("[" if sent == 0 else ",\r\n") + text
                await asyncio.sleep(step.chunk_delay)
            if not sse:
                yield "]"

        return StreamingResponse(frames(), media_type="text/event-stream" if sse else "application/json")
