"""gateway/edge/connections.py: the gate's cap, the descriptor limit, and the header deadline inside uvicorn.

The protocol tests serve a small app (its lifespan hands uvicorn a `ConnectionGate`, as the gateway's
does) with each of uvicorn's two HTTP/1.1 implementations under the guard, on a real socket.
"""
from __future__ import annotations

import resource
import socket
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.edge import connections
from gateway.edge.connections import GATE_STATE, REFUSAL, ConnectionGate, GuardedH11Protocol, usable_connections

HEADER_TIMEOUT = 0.5


class _Transport:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class _Connection:
    def __init__(self) -> None:
        self.transport = _Transport()


def test_the_gate_admits_up_to_its_limit_then_closes_the_longest_idle() -> None:
    gate = ConnectionGate(limit=2, header_timeout=1)
    first, second, third = _Connection(), _Connection(), _Connection()
    assert gate.admit(first) and gate.admit(second)
    gate.idle(first)
    gate.idle(second)
    gate.busy(first)  # a request in progress: not to be closed
    assert gate.admit(third)
    assert second.transport.closed and not first.transport.closed
    assert (gate.open, gate.evicted, gate.refused) == (2, 1, 0)


def test_the_gate_refuses_when_every_connection_has_a_request_in_progress() -> None:
    gate = ConnectionGate(limit=1, header_timeout=1)
    busy = _Connection()
    assert gate.admit(busy)
    assert not gate.admit(_Connection())
    assert not busy.transport.closed and (gate.open, gate.refused) == (1, 1)
    gate.leave(busy)
    gate.leave(busy)  # twice: once evicted or refused, then from connection_lost
    assert gate.open == 0 and gate.admit(_Connection())


def test_the_refusal_is_a_503_with_retry_after_in_openai_shape() -> None:
    head, body = REFUSAL.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in head and b"connection: close" in head
    assert f"content-length: {len(body)}".encode() in head
    assert b'"code": "too_many_connections"' in body and b'"type": "api_error"' in body


def test_the_cap_is_lowered_to_what_the_descriptor_limit_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = {"now": (1024, 1024)}
    monkeypatch.setattr(connections.resource, "getrlimit", lambda _: limits["now"])
    monkeypatch.setattr(connections.resource, "setrlimit", lambda _, value: limits.update(now=value))
    assert usable_connections(4096) == (1024 - connections.RESERVED_DESCRIPTORS) // 2
    limits["now"] = (1024, 1_000_000)
    assert usable_connections(4096) == 4096
    assert limits["now"] == (2 * 4096 + connections.RESERVED_DESCRIPTORS, 1_000_000)  # the soft limit raised
    assert usable_connections(10) == 10 and limits["now"][0] > 10  # never lowered


def test_the_real_descriptor_limit_is_enough_for_a_small_cap() -> None:
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert usable_connections(8) == 8
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= before[0]


# -- the guard inside uvicorn -------------------------------------------------------------------

def _app(gate: ConnectionGate) -> Starlette:
    async def hello(request: Request) -> PlainTextResponse:
        try:
            await request.body()
        except ClientDisconnect:  # a socket the test closes with its body unsent
            pass
        return PlainTextResponse("hello")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        yield {GATE_STATE: gate}

    return Starlette(routes=[Route("/", hello, methods=["GET", "POST"])], lifespan=lifespan)


@contextmanager
def _serving(protocol: type, gate: ConnectionGate) -> Iterator[int]:
    config = uvicorn.Config(_app(gate), host="127.0.0.1", port=0, http=protocol, log_level="warning",
                            timeout_keep_alive=30)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


def _protocols() -> list[type]:
    found = [GuardedH11Protocol]
    if hasattr(connections, "GuardedHttpToolsProtocol"):
        found.append(connections.GuardedHttpToolsProtocol)
    return found


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed `sock` (EOF or reset), None if it stayed open that long."""
    began = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except socket.timeout:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - began


def _ask(sock: socket.socket) -> bytes:
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b"hello"):
        answer += sock.recv(4096)
    return answer


@pytest.mark.parametrize("protocol", _protocols(), ids=lambda p: p.__name__)
def test_headers_that_do_not_arrive_in_time_close_the_connection(protocol: type) -> None:
    gate = ConnectionGate(limit=100, header_timeout=HEADER_TIMEOUT)
    with _serving(protocol, gate) as port:
        silent = socket.create_connection(("127.0.0.1", port))
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n")
        for sock in (silent, half):
            waited = _closed_within(sock, 10)
            assert waited is not None and waited < HEADER_TIMEOUT + 2
            sock.close()
        assert gate.timed_out == 2
        deadline = time.monotonic() + 5
        while gate.open and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gate.open == 0


@pytest.mark.parametrize("protocol", _protocols(), ids=lambda p: p.__name__)
def test_a_request_slower_than_the_header_timeout_in_all_is_not_cut(protocol: type) -> None:
    """The deadline is for the headers: a kept-alive connection serves several requests over more time
    than it, and its next request's headers get a deadline of their own from their first byte."""
    gate = ConnectionGate(limit=100, header_timeout=HEADER_TIMEOUT)
    with _serving(protocol, gate) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        assert _ask(sock).startswith(b"HTTP/1.1 200")
        time.sleep(HEADER_TIMEOUT * 1.5)  # idle between requests: uvicorn's keep-alive timeout (30 s here)
        assert _ask(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET / HTTP/1.1\r\n")  # the next one's headers, and then nothing
        waited = _closed_within(sock, 10)
        assert waited is not None and HEADER_TIMEOUT * 0.8 < waited < HEADER_TIMEOUT + 2


@pytest.mark.parametrize("protocol", _protocols(), ids=lambda p: p.__name__)
def test_at_the_cap_a_new_connection_takes_an_idle_ones_place_or_is_refused(protocol: type) -> None:
    gate = ConnectionGate(limit=2, header_timeout=30)
    with _serving(protocol, gate) as port:
        idle = socket.create_connection(("127.0.0.1", port))
        idle.sendall(b"GET / HTTP/1.1\r\n")
        time.sleep(0.1)
        # a request in progress: its body is awaited
        busy = socket.create_connection(("127.0.0.1", port))
        busy.sendall(b"POST / HTTP/1.1\r\nHost: x\r\ncontent-length: 10\r\n\r\n12345")
        time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", port)) as newcomer:
            assert _ask(newcomer).startswith(b"HTTP/1.1 200")
            assert _closed_within(idle, 5) is not None  # closed to make room
            # now both connections have a request in progress (the newcomer's is kept alive but idle,
            # so it is the one to go); fill its place with another request in progress
            newcomer.sendall(b"POST / HTTP/1.1\r\nHost: x\r\ncontent-length: 10\r\n\r\n1")
            time.sleep(0.1)
            with socket.create_connection(("127.0.0.1", port)) as refused:
                answer = refused.recv(4096)
                assert answer == REFUSAL
        busy.sendall(b"67890")
        assert busy.recv(4096).startswith(b"HTTP/1.1 200")
        busy.close()
        idle.close()
    assert (gate.evicted, gate.refused) == (1, 1)
