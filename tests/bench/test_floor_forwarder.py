"""bench/floor_forwarder.py, the floor of bench/proxy_compare.py, as the benchmark starts it (its own
process) against a tiny upstream on a loopback port: a request's bytes reach the upstream as they were
sent, and the upstream's status, body and content-type come back as they were answered, an SSE answer
included; a request with no bearer key is refused. Every wait is bounded (a few seconds; 30 s for the
start). With --durable, each request's row is committed to the SQLite file before the upstream sees it."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from scripts.processes import free_port

REPO = Path(__file__).resolve().parents[2]
BODY = '{"model": "fake",  "messages": [{"role": "user", "content": "caf\\u00e9 \u2603 \\"q\\""}]}\n'.encode()
ANSWER = b'{"id": "x-1",  "odd": "spacing kept", "n": 1.50}'
EVENTS = b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'


class Upstream(BaseHTTPRequestHandler):
    """Records each request (method, path, content-type, body); answers 201 with ANSWER as
    application/vnd.test+json, or EVENTS as text/event-stream on .../stream."""

    seen: ClassVar[list[tuple[str, str, str | None, bytes]]] = []
    durable: ClassVar[Path | None] = None  # the durable floor's file: its rows are counted as each request comes
    rows_seen: ClassVar[list[list[tuple[str, int]]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.seen.append(("POST", self.path, self.headers.get("content-type"), body))
        if self.durable is not None:
            with sqlite3.connect(self.durable) as connection:  # another connection: committed rows only
                self.rows_seen.append(connection.execute("SELECT path, body_bytes FROM requests ORDER BY id").fetchall())
        if self.path.endswith("/stream"):
            self._answer(200, "text/event-stream", EVENTS)
        else:
            self._answer(201, "application/vnd.test+json", ANSWER)

    def _answer(self, status: int, content_type: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    Upstream.seen, Upstream.durable, Upstream.rows_seen = [], None, []
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Upstream)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def floor(upstream: str, tmp_path: Path) -> Iterator[str]:
    yield from _floor(upstream, tmp_path, [])


@pytest.fixture
def durable_floor(upstream: str, tmp_path: Path) -> Iterator[str]:
    Upstream.durable = tmp_path / "floor.db"
    yield from _floor(upstream, tmp_path, ["--durable", str(Upstream.durable)])


def _floor(upstream: str, tmp_path: Path, options: list[str]) -> Iterator[str]:
    """The forwarder in its own process group, up once it answers (any status) within 30 s."""
    port = free_port()
    log = (tmp_path / "floor.log").open("wb")
    process = subprocess.Popen([sys.executable, str(REPO / "bench" / "floor_forwarder.py"), "--upstream", upstream,
                                "--port", str(port), *options], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (tmp_path / "floor.log").read_text()
            try:
                httpx.get(f"{base}/up", timeout=1, trust_env=False)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the floor did not answer within 30 s"
                time.sleep(0.05)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


def test_a_request_round_trips_byte_for_byte(floor: str) -> None:
    response = httpx.post(f"{floor}/chat/completions", content=BODY, timeout=10, trust_env=False,
                          headers={"authorization": "Bearer sk-any", "content-type": "application/json"})
    assert (response.status_code, response.content) == (201, ANSWER)
    assert response.headers["content-type"] == "application/vnd.test+json"
    assert Upstream.seen == [("POST", "/v1/chat/completions", "application/json", BODY)]


def test_an_event_stream_passes_through(floor: str) -> None:
    with httpx.stream("POST", f"{floor}/chat/stream", content=BODY, timeout=10, trust_env=False,
                      headers={"authorization": "Bearer sk-any", "content-type": "application/json"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        assert response.read() == EVENTS


def test_no_bearer_key_is_refused_before_the_upstream(floor: str) -> None:
    response = httpx.post(f"{floor}/chat/completions", content=BODY, timeout=10, trust_env=False)
    assert response.status_code == 401
    assert Upstream.seen == []


def test_the_durable_floor_commits_a_row_before_forwarding(durable_floor: str) -> None:
    """The upstream, reading the file on its own connection as each request comes, finds that request's
    row committed already (and one per request: two requests, two rows); the file is in WAL mode."""
    for _ in range(2):
        response = httpx.post(f"{durable_floor}/chat/completions", content=BODY, timeout=10, trust_env=False,
                              headers={"authorization": "Bearer sk-any", "content-type": "application/json"})
        assert (response.status_code, response.content) == (201, ANSWER)
    row = ("/v1/chat/completions", len(BODY))
    assert Upstream.rows_seen == [[row], [row, row]]
    with sqlite3.connect(Upstream.durable) as connection:  # type: ignore[arg-type]
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
