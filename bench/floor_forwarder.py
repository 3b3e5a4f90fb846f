"""The floor: a bare forwarder, the least any proxy in front of the upstream can add.

    .venv/bin/python bench/floor_forwarder.py --upstream http://127.0.0.1:18090/v1 [--port 18091] [--workers N]

A Starlette app under uvicorn (uvloop and httptools when installed, as `gateway serve`;
one worker unless --workers N, as the gateway target of bench/proxy_compare.py). Any
GET or POST under /v1/ needs an `Authorization: Bearer <something>` (any key: it is only
checked to be there, else 401), then its body goes, unread beyond its bytes, to the same
path of --upstream with one pooled, keep-alive `httpx.AsyncClient` per worker (module-level,
sized for 50 concurrent clients and more), and the upstream's status, body and content-type
come back as they are. An SSE answer (text/event-stream) is streamed through chunk by chunk,
anything else read whole first. No JSON is parsed, nothing is stored, nothing is logged.
Whatever a real proxy adds above this target's figures is the proxy's own work; what this
target adds above `direct` is the cost of an HTTP hop in Python on this machine.

With --durable PATH it is the durable floor: before a request goes on, one small row of it (its path,
its size, when it came) is committed to the SQLite file PATH, in a worker thread, as the gateway commits
its capture (WAL, synchronous=FULL: the commit is on disk before the upstream sees the request). The
least any proxy that keeps a record of each request before forwarding it can add on this machine; the
gateway's capture writes more (the new messages, its artifacts) and its projection and record come on top.
"""
from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

UPSTREAM_ENV = "FLOOR_UPSTREAM"  # how --upstream reaches every uvicorn worker
DURABLE_ENV = "FLOOR_DURABLE"  # and --durable
UPSTREAM_KEY = "sk-upstream"
MAX_CONNECTIONS = 256  # well above the 50 concurrent clients of the heaviest load: never a queue for a connection
UNAUTHORIZED = (b'{"error": {"message": "missing bearer key", "type": "invalid_request_error", '
                b'"param": null, "code": "invalid_api_key"}}')

# One pool per worker process, made at import (each uvicorn worker imports this module itself),
# closed when the worker shuts down.
client = httpx.AsyncClient(
    base_url=os.environ.get(UPSTREAM_ENV, "http://127.0.0.1:18090/v1").rstrip("/"),
    headers={"authorization": f"Bearer {UPSTREAM_KEY}"},
    limits=httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS,
                        keepalive_expiry=60),
    timeout=httpx.Timeout(120, connect=10),
    trust_env=False,  # 127.0.0.1 only: never through a proxy from the environment
)


class DurableLog:
    """One row per request, committed before it is forwarded: SQLite in WAL mode with synchronous=FULL,
    as the gateway's store (storage/database.py), one connection under a lock (one commit at a time)."""

    def __init__(self, path: str) -> None:
        self.connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.connection.execute("PRAGMA journal_mode=WAL")
        self.connection.execute("PRAGMA synchronous=FULL")
        self.connection.execute("PRAGMA busy_timeout=30000")  # several workers share the file
        self.connection.execute("CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY, path TEXT NOT NULL, "
                                "body_bytes INTEGER NOT NULL, received_at REAL NOT NULL)")
        self.lock = threading.Lock()

    def record(self, path: str, body_bytes: int) -> None:
        with self.lock:
            self.connection.execute("BEGIN IMMEDIATE")
            self.connection.execute("INSERT INTO requests (path, body_bytes, received_at) VALUES (?, ?, ?)",
                                    (path, body_bytes, time.time()))
            self.connection.execute("COMMIT")


durable = DurableLog(os.environ[DURABLE_ENV]) if os.environ.get(DURABLE_ENV) else None


def has_bearer(request: Request) -> bool:
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and bool(key.strip())


async def forward(request: Request) -> Response:
    """The request's bytes to the upstream's same path; its status, body and content-type back."""
    if not has_bearer(request):
        return Response(UNAUTHORIZED, status_code=401, media_type="application/json")
    headers = {"content-type": request.headers["content-type"]} if "content-type" in request.headers else {}
    body = await request.body()
    if durable is not None:
        await run_in_threadpool(durable.record, request.url.path, len(body))
    upstream_request = client.build_request(request.method, "/" + request.path_params["path"],
                                            params=request.url.query or None, headers=headers, content=body)
    answer = await client.send(upstream_request, stream=True)
    # As a header, not a media_type: Starlette would add "; charset=utf-8" to a text/* one.
    content_type = answer.headers.get("content-type")
    kept = {"content-type": content_type} if content_type is not None else None
    if content_type is not None and content_type.startswith("text/event-stream"):
        return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code, headers=kept,
                                 background=BackgroundTask(answer.aclose))
    try:
        body = await answer.aread()
    finally:
        await answer.aclose()
    return Response(body, status_code=answer.status_code, headers=kept)


@asynccontextmanager
async def lifespan(_: Starlette) -> AsyncIterator[None]:
    yield
    await client.aclose()


app = Starlette(routes=[Route("/v1/{path:path}", forward, methods=["GET", "POST"])], lifespan=lifespan)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="the upstream's base URL, e.g. http://127.0.0.1:18090/v1")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18091)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (default 1)")
    parser.add_argument("--durable", metavar="PATH", help="commit a row of each request to this SQLite file "
                                                          "before forwarding it (the durable floor)")
    args = parser.parse_args()
    if args.durable:
        os.environ[DURABLE_ENV] = str(Path(args.durable).resolve())
    # Set before uvicorn imports `bench.floor_forwarder` (in this process, or in each worker it spawns),
    # whose module-level client reads it; this file run as a script is `__main__`, a module of its own.
    os.environ[UPSTREAM_ENV] = args.upstream
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    uvicorn.run("bench.floor_forwarder:app", host=args.host, port=args.port, workers=args.workers,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
