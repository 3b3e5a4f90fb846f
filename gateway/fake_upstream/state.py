"""What the fake upstream answers next, and what it has been sent.

A `Step` is one scripted answer: an assistant message (or, per format, Anthropic
content blocks or Responses output items), an HTTP error, a delay, a broken
stream, raw bytes. `FakeState` holds the queue of steps, the requests received,
and per format an optional responder: a function of the request body that gives
the step (agent mode, gateway/fake_upstream/agent.py), so that an answer can
follow the conversation rather than a fixed queue.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from fastapi.responses import JSONResponse, Response

Responder = Callable[[dict[str, Any]], "Step"]


@dataclass
class Step:
    message: dict[str, Any] | None = None
    status: int = 200
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    usage: dict[str, Any] | None = None
    break_stream_after: int | None = None  # drop the connection after N chunks
    chunk_delay: float = 0.0  # seconds between SSE chunks
    raw: str | None = None  # answer these bytes as they are (garbage: truncated JSON, HTML, ...)
    content_type: str = "application/json"
    blocks: list[dict[str, Any]] | None = None  # /v1/messages: the Anthropic content blocks to answer
    items: list[dict[str, Any]] | None = None  # /v1/responses: the output items to answer
    stop_reason: str | None = None  # /v1/messages: default tool_use or end_turn; Gemini: default STOP
    parts: list[dict[str, Any]] | None = None  # Gemini: the parts to answer (functionCall, thoughtSignature...)


@dataclass
class FakeState:
    script: list[Step] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    default_delay: float = 0.0  # seconds before an unscripted answer (standalone --delay)
    anthropic_cache: set[str] = field(default_factory=set)  # /v1/messages: prefix digests written
    tool_changes: bool = True  # /v1/messages: False answers 400 to mid-conversation tool additions
    # Without a scripted step, a function of the request body that gives one (an agent that decides
    # from the conversation, so requests a client makes on the side take nothing away), per format:
    responder: Responder | None = None  # /v1/messages
    responses_responder: Responder | None = None  # /v1/responses
    chat_responder: Responder | None = None  # /v1/chat/completions
    gemini_responder: Responder | None = None  # /v1beta/models/{model}:generateContent
    keep_requests: int | None = None  # standalone: remember only the latest N requests
    default_step: dict[str, Any] | None = None  # the step of every unscripted answer (POST /_default)
    received: int = 0  # requests since the start or the last reset (answers are numbered by it)
    # /v1/responses/compact (gateway/fake_upstream/compaction.py): what each compaction item stands for,
    # by its number; False answers 404, as a server without the endpoint does
    compacted: dict[str, list[Any]] = field(default_factory=dict)
    compact_endpoint: bool = True

    def next_step(self) -> Step:
        with self.lock:
            if self.script:
                return self.script.pop(0)
            return Step(**self.default_step) if self.default_step is not None else Step(delay=self.default_delay)

    def record(self, request: Any, body: Any, path: str | None = None) -> int:
        """Keep one request (the caller holds `lock`), only the latest `keep_requests`; its number."""
        entry = {"t": time.time(), "body": body, "headers": dict(request.headers)}
        if path is not None:  # the chat route's entries carry none (tests tell them apart by that)
            entry["path"] = path
        self.requests.append(entry)
        self.received += 1
        if self.keep_requests is not None and len(self.requests) > self.keep_requests:
            del self.requests[: len(self.requests) - self.keep_requests]
        return self.received

    def answer(self, body: dict[str, Any], responder: Responder | None) -> Step:
        """The next scripted step if one is queued, else the responder's for `body`, else the default."""
        with self.lock:
            scripted = bool(self.script)
        return self.next_step() if scripted or responder is None else responder(body)

    def clear(self) -> None:
        with self.lock:
            self.script.clear()
            self.requests.clear()
            self.anthropic_cache.clear()
            self.tool_changes = True
            self.default_step = None
            self.received = 0
            self.compacted.clear()
            self.compact_endpoint = True


async def scripted_failure(step: Step, anthropic: bool = False, google: bool = False) -> Response | None:
    """After the step's delay: its raw bytes, or its HTTP error in the format's shape (Anthropic's,
    Google's or OpenAI's); None when the step is an answer."""
    if step.delay:
        await asyncio.sleep(step.delay)
    if step.raw is not None:
        return Response(step.raw.encode(), status_code=step.status, media_type=step.content_type)
    if step.status == 200:
        return None
    message = f"scripted error {step.status}"
    if anthropic:
        body = {"type": "error", "error": step.error or {"type": "api_error", "message": message}}
    elif google:
        body = {"error": step.error or {"code": step.status, "message": message, "status": "UNAVAILABLE"}}
    else:
        body = {"error": step.error or {"message": message, "type": "api_error", "param": None, "code": None}}
    return JSONResponse(body, status_code=step.status, headers=step.headers)
