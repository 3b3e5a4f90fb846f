"""A constant-time OpenAI-compatible upstream: the floor that proxies are measured against.

    .venv/bin/python bench/constant_upstream.py [--host 127.0.0.1] [--port 18090]

A raw asyncio HTTP/1.1 server (uvloop when installed), keep-alive, no framework:
`POST /v1/chat/completions` reads and discards the whole body and answers a fixed
small chat completion with `usage` at once, or, when the body has `"stream": true`,
a short SSE stream (role, content, finish, usage, `data: [DONE]`). `GET /v1/models`
lists the one model `fake`. Bodies may come with Content-Length or chunked.
Everything else is 404. Nothing is kept between requests but a counter for ids.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import time
from typing import Any

MAX_HEAD_BYTES = 64 * 1024
USAGE = {"prompt_tokens": 1000, "completion_tokens": 7, "total_tokens": 1007,
         "prompt_tokens_details": {"cached_tokens": 0}}
MODELS = json.dumps({"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "bench"}]}).encode()
NOT_FOUND = json.dumps({"error": {"message": "not found", "type": "invalid_request_error",
                                  "param": None, "code": "not_found"}}).encode()
STREAM_KEY = re.compile(rb'"stream"\s*:\s*true')
_ids = itertools.count(1)


def completion() -> bytes:
    return json.dumps({
        "id": f"chatcmpl-const-{next(_ids)}", "object": "chat.completion", "created": int(time.time()),
        "model": "fake", "system_fingerprint": "fp_const",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop",
                     "logprobs": None}],
        "usage": USAGE,
    }).encode()


def stream() -> bytes:
    base = {"id": f"chatcmpl-const-{next(_ids)}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": "fake", "system_fingerprint": "fp_const"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events = [chunk({"role": "assistant", "content": ""}), chunk({"content": "ok"}), chunk({}, "stop"),
              {**base, "choices": [], "usage": USAGE}]
    return "".join(f"data: {json.dumps(event)}\n\n" for event in events).encode() + b"data: [DONE]\n\n"


def wants_stream(body: bytes) -> bool:
    """A top-level `"stream": true`: inside JSON strings quotes are escaped, so the key cannot be faked."""
    at = body.find(b'"stream"')
    while at >= 0:
        if STREAM_KEY.match(body, at):
            return True
        at = body.find(b'"stream"', at + 1)
    return False


def response(status: str, content_type: str, payload: bytes, close: bool) -> bytes:
    head = (f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(payload)}\r\n"
            f"connection: {'close' if close else 'keep-alive'}\r\n\r\n")
    return head.encode() + payload


def answer(method: str, path: str, body: bytes, close: bool) -> bytes:
    path = path.split("?", 1)[0].rstrip("/")
    if method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
        if wants_stream(body):
            return response("200 OK", "text/event-stream", stream(), close)
        return response("200 OK", "application/json", completion(), close)
    if method == "GET" and path in ("/v1/models", "/models"):
        return response("200 OK", "application/json", MODELS, close)
    return response("404 Not Found", "application/json", NOT_FOUND, close)


class Connection(asyncio.Protocol):
    """One keep-alive connection: parse a head, collect its body, answer, repeat."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.head: tuple[str, str, bool] | None = None  # method, path, close after answering
        self.length = 0  # body bytes still expected (Content-Length)
        self.chunked = False
        self.body = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None and self._step():
            pass

    def _step(self) -> bool:
        """Advance by one parse step; False when more bytes are needed."""
        if self.head is None:
            return self._parse_head()
        if self.chunked:
            return self._parse_chunk()
        take = min(self.length, len(self.buffer))
        self.body += self.buffer[:take]
        del self.buffer[:take]
        self.length -= take
        if self.length:
            return False
        self._finish()
        return True

    def _parse_head(self) -> bool:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                self._fail()
            return False
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        del self.buffer[: end + 4]
        try:
            method, path, version = lines[0].split(" ", 2)
        except ValueError:
            self._fail()
            return False
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        close = headers.get("connection") == "close" or version == "HTTP/1.0"
        self.head = (method, path, close)
        self.chunked = "chunked" in headers.get("transfer-encoding", "")
        self.length = int(headers.get("content-length") or 0)
        return True

    def _parse_chunk(self) -> bool:
        end = self.buffer.find(b"\r\n")
        if end < 0:
            return False
        size = int(bytes(self.buffer[:end]).split(b";", 1)[0], 16)
        if size == 0:
            trailer_end = self.buffer.find(b"\r\n\r\n", end)
            if trailer_end < 0:
                return False
            del self.buffer[: trailer_end + 4]
            self._finish()
            return True
        if len(self.buffer) < end + 2 + size + 2:
            return False
        self.body += self.buffer[end + 2: end + 2 + size]
        del self.buffer[: end + 2 + size + 2]
        return True

    def _finish(self) -> None:
        assert self.head is not None and self.transport is not None
        method, path, close = self.head
        self.transport.write(answer(method, path, bytes(self.body), close))
        self.head, self.body, self.chunked, self.length = None, bytearray(), False, 0
        if close:
            self.transport.close()
            self.transport = None

    def _fail(self) -> None:
        assert self.transport is not None
        self.transport.write(response("400 Bad Request", "text/plain", b"bad request", True))
        self.transport.close()
        self.transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(host: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Connection, host, port, backlog=1024)
    print(f"constant upstream on http://{host}:{port}/v1", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18090)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.host, args.port))
    else:
        uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
