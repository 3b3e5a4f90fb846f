"""A scripted OpenAI-compatible upstream on a real socket, for tests and benchmarks.

Each call to `/v1/chat/completions` (or to `/v1/messages`, Anthropic's format,
tests/fake_anthropic.py) takes the next scripted step (or answers "ok"): an
assistant message, an HTTP error, a delay, a broken stream. Every request body
and its headers are recorded. Streams are real SSE, with content and tool-call
arguments split across chunks as providers do.

In-process: `with FakeUpstream() as fake: fake.script_message(...)`.
Standalone: `python tests/fake_upstream.py --port 18080`, driven over
`POST /_script`, `POST /_default` (the step of every unscripted answer),
`GET /_requests`, `POST /_reset`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

if __package__ in (None, ""):  # run as a script: python tests/fake_upstream.py
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fake_anthropic import add_messages_routes  # noqa: E402
from tests.fake_responses import add_responses_routes, cached_prefix  # noqa: E402


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
    stop_reason: str | None = None  # /v1/messages: default tool_use or end_turn


@dataclass
class FakeState:
    script: list[Step] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    default_delay: float = 0.0  # seconds before an unscripted answer (standalone --delay)
    anthropic_cache: set[str] = field(default_factory=set)  # /v1/messages: prefix digests written
    tool_changes: bool = True  # /v1/messages: False answers 400 to mid-conversation tool additions
    # /v1/messages without a scripted step: a function of the request body that gives one (an agent
    # that decides from the conversation, so requests a client makes on the side take nothing away)
    responder: Any = None
    responses_responder: Any = None  # the same for /v1/responses
    keep_requests: int | None = None  # standalone: remember only the latest N requests
    default_step: dict[str, Any] | None = None  # the step of every unscripted answer (POST /_default)

    def next_step(self) -> Step:
        with self.lock:
            if self.script:
                return self.script.pop(0)
            return Step(**self.default_step) if self.default_step is not None else Step(delay=self.default_delay)


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


def build_app(state: FakeState) -> FastAPI:
    app = FastAPI()

    @app.post("/_script")
    async def script(request: Request) -> dict[str, int]:
        body = await request.json()
        with state.lock:
            state.script.append(Step(**body))
        return {"queued": len(state.script)}

    @app.post("/_default")
    async def default(request: Request) -> dict[str, bool]:
        """The step every unscripted answer takes from now on (`{}`: the plain "ok" again)."""
        body = await request.json()
        Step(**body)  # checked now, not on the next answer
        with state.lock:
            state.default_step = body or None
        return {"ok": True}

    @app.post("/_reset")
    async def reset() -> dict[str, bool]:
        with state.lock:
            state.script.clear()
            state.requests.clear()
            state.anthropic_cache.clear()
            state.tool_changes = True
            state.default_step = None
        return {"ok": True}

    @app.get("/_requests")
    async def requests_() -> list[dict[str, Any]]:
        return state.requests

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "fake"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        with state.lock:
            earlier = [r["body"].get("messages", []) for r in state.requests]
            state.requests.append({"t": time.time(), "body": body, "headers": dict(request.headers)})
            number = len(state.requests)
            if state.keep_requests is not None and len(state.requests) > state.keep_requests:
                del state.requests[: len(state.requests) - state.keep_requests]
        step = state.next_step()
        if step.delay:
            await asyncio.sleep(step.delay)
        if step.raw is not None:
            return Response(step.raw.encode(), status_code=step.status, media_type=step.content_type)
        if step.status != 200:
            error = step.error or {"message": f"scripted error {step.status}", "type": "api_error",
                                   "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=step.status, headers=step.headers)
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

    add_messages_routes(app, state)
    add_responses_routes(app, state)
    return app


class ServerThread:
    """A uvicorn server for `app` in a background thread, on a free port."""

    def __init__(self, app: Any, port: int = 0) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                lifespan="on", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 120  # a loaded 2-core machine takes a while to import LiteLLM
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class FakeUpstream:
    def __init__(self, port: int = 0, wrap: Callable[[Any], Any] | None = None) -> None:
        """`wrap`: ASGI middleware to serve the fake's app behind (tests/listeners.py records with it)."""
        self.state = FakeState()
        app = build_app(self.state)
        self._server = ServerThread(app if wrap is None else wrap(app), port)

    def __enter__(self) -> "FakeUpstream":
        self._server.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.stop()

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def api_base(self) -> str:
        return f"{self._server.url}/v1"

    def reset(self) -> None:
        with self.state.lock:
            self.state.script.clear()
            self.state.requests.clear()
            self.state.anthropic_cache.clear()
            self.state.tool_changes = True
            self.state.default_step = None

    def script(self, **step: Any) -> None:
        with self.state.lock:
            self.state.script.append(Step(**step))

    def script_message(self, message: dict[str, Any], **step: Any) -> None:
        self.script(message=message, **step)

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return list(self.state.requests)

    def last_body(self) -> dict[str, Any]:
        return self.requests[-1]["body"]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each unscripted answer")
    parser.add_argument("--keep-requests", type=int, default=1000, help="requests remembered for GET /_requests")
    args = parser.parse_args()
    state = FakeState(default_delay=args.delay, keep_requests=args.keep_requests)
    uvicorn.run(build_app(state), host="127.0.0.1", port=args.port, log_level="warning")
