"""Loopback listeners that record what reaches them, for the tests that no request steers the gateway.

- `RecordedUpstream`: the fake upstream (testkit/fake_upstream.py: chat, Messages, Responses,
  embeddings, completions) behind a recorder of every HTTP request it receives, whatever its path
  (a 404 included): method, path, query and headers, with the body for the routes the fake serves.
- `CatchAll`: a raw TCP listener standing in for every other host. It records the first bytes of
  each connection (an HTTP request line and headers, a proxy's CONNECT, a TLS hello) and answers
  502, so a gateway pointed at it through a proxy variable, a provider's `*_API_BASE` or a URL in a
  request would show here.
"""
from __future__ import annotations

import socket
import socketserver
import threading
from dataclasses import dataclass, field
from typing import Any

from testkit.fake_upstream import FakeUpstream


@dataclass
class Seen:
    method: str
    path: str
    query: str
    headers: dict[str, str]


class _Recorder:
    """Plain ASGI: every HTTP request's method, path, query and headers, then the app's answer."""

    def __init__(self, app: Any, seen: list[Seen], lock: threading.Lock) -> None:
        self.app, self.seen, self.lock = app, seen, lock

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            with self.lock:
                self.seen.append(Seen(scope["method"], scope["path"], scope["query_string"].decode("latin-1"),
                                      headers))
        await self.app(scope, receive, send)


class RecordedUpstream(FakeUpstream):
    """The fake upstream on a free loopback port; `seen` holds every request it received."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._seen: list[Seen] = []
        super().__init__(wrap=lambda app: _Recorder(app, self._seen, self.lock))

    def __enter__(self) -> "RecordedUpstream":
        super().__enter__()
        return self

    @property
    def host(self) -> str:
        return self.url.removeprefix("http://")

    @property
    def seen(self) -> list[Seen]:
        with self.lock:
            return list(self._seen)


@dataclass
class CatchAll:
    """A raw TCP listener on loopback recording the first bytes of every connection."""

    received: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(2)
                try:
                    data = self.request.recv(65536)
                except (socket.timeout, OSError):
                    data = b""
                with outer.lock:
                    outer.received.append(data or b"<connection without data>")
                try:
                    self.request.sendall(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                except OSError:
                    pass

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "CatchAll":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def contacts(self) -> list[bytes]:
        with self.lock:
            return list(self.received)
