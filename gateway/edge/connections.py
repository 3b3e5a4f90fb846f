"""Connections at the socket: a deadline for request headers and a cap on open connections.

uvicorn reads request headers without a deadline: a client that sends half a request and then nothing
keeps its socket for good, and enough of them take every descriptor the process may open. `gateway
serve` serves with `GuardedProtocol` (uvicorn's httptools protocol, or its h11 one where httptools is
missing) and a `ConnectionGate` of the process, which:

- closes a connection whose request headers have not all arrived `server.header_timeout_seconds` after
  it opened (on a kept-alive connection: after the first byte of its next request; one that stays
  silent between requests is closed by uvicorn's keep-alive timeout, 5 s);
- keeps at most `server.max_connections` open: at the cap, the connection that has waited longest with
  no request in progress (still sending its headers, or idle between requests) is closed to make room;
  when every one has a request in progress, the new one is answered 503 with `retry-after` and closed
  at once. The cap is lowered to what the process's descriptor limit allows (`usable_connections`).

The gate reaches the protocol through the app's lifespan state (uvicorn hands it to every protocol it
makes as `app_state`); under an app without one the protocol is uvicorn's own. A connection upgraded
to a WebSocket leaves the gate (the WebSocket protocol takes the socket over).
"""
from __future__ import annotations

import asyncio
import json
import logging
import resource
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.errors import ServiceUnavailable

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

log = logging.getLogger("gateway")

GATE_STATE = "gateway.connection_gate"  # the gate's key in the lifespan state
# Descriptors kept for what is not a client connection (database pool, log files, blob files, the
# event loop's own); and each client connection with a request in progress may hold one upstream socket.
RESERVED_DESCRIPTORS = 256
RETRY_AFTER_SECONDS = 1


def _refusal() -> bytes:
    error = ServiceUnavailable("The gateway has as many connections open as it may; try again shortly.",
                               code="too_many_connections", retry_after=RETRY_AFTER_SECONDS)
    body = json.dumps(error.body()).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"retry-after: %d\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
            % (RETRY_AFTER_SECONDS, len(body), body))


REFUSAL = _refusal()


def usable_connections(wanted: int) -> int:
    """`wanted`, or fewer if the process may not open enough descriptors for them: the soft limit is
    raised as far as the hard one allows (two descriptors a connection: the client's, an upstream's)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * wanted + RESERVED_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    usable = max(1, (soft - RESERVED_DESCRIPTORS) // 2)
    log.warning("server.max_connections %d lowered to %d: this process may open %d descriptors (ulimit -n)",
                wanted, usable, soft)
    return usable


class ConnectionGate:
    """The open connections of one process, at most `limit`; those with no request in progress are
    kept in the order they became so, the longest waiting first."""

    def __init__(self, limit: int, header_timeout: float) -> None:
        self.limit = limit
        self.header_timeout = header_timeout
        self._open: set[Any] = set()
        self._idle: dict[Any, None] = {}  # insertion-ordered
        self.refused = 0
        self.evicted = 0
        self.timed_out = 0

    @property
    def open(self) -> int:
        return len(self._open)

    def admit(self, connection: Any) -> bool:
        """Room for `connection` (closing the longest idle one at the cap), or False: refuse it."""
        if len(self._open) >= self.limit:
            victim = next(iter(self._idle), None)
            if victim is None:
                self.refused += 1
                return False
            self.evicted += 1
            self.leave(victim)
            victim.transport.close()
        self._open.add(connection)
        return True

    def idle(self, connection: Any) -> None:
        if connection in self._open and connection not in self._idle:
            self._idle[connection] = None

    def busy(self, connection: Any) -> None:
        self._idle.pop(connection, None)

    def leave(self, connection: Any) -> None:
        self._open.discard(connection)
        self._idle.pop(connection, None)


class _Guarded:
    """Mixed in before one of uvicorn's HTTP/1.1 protocols (their attributes are used as they are)."""

    app_state: dict[str, Any]
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    cycle: Any
    _gate: ConnectionGate | None = None
    _refused = False
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        gate = self.app_state.get(GATE_STATE)
        if isinstance(gate, ConnectionGate) and not gate.admit(self):
            self._refused = True
            transport.write(REFUSAL)
            transport.close()
            return
        super().connection_made(transport)  # type: ignore[misc]
        if isinstance(gate, ConnectionGate):
            self._gate = gate
            gate.idle(self)
            self._header_timer = self.loop.call_later(gate.header_timeout, self._headers_late)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._leave_gate()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)  # type: ignore[misc]
        self._follow(arm=True)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._follow(arm=False)  # silent until the next request: uvicorn's keep-alive timeout

    def handle_websocket_upgrade(self, *args: Any) -> None:
        self._leave_gate()
        super().handle_websocket_upgrade(*args)  # type: ignore[misc]

    def _waiting(self) -> bool:
        """No request in progress: still sending headers, or between requests."""
        return self.cycle is None or self.cycle.response_complete

    def _follow(self, arm: bool) -> None:
        gate = self._gate
        if gate is None or self.transport.is_closing():
            return
        if not self._waiting():
            gate.busy(self)
            self._stop_timer()
            return
        gate.idle(self)
        if arm and self._header_timer is None:
            self._header_timer = self.loop.call_later(gate.header_timeout, self._headers_late)

    def _headers_late(self) -> None:
        self._header_timer = None
        gate = self._gate
        if gate is None or self.transport.is_closing() or not self._waiting():
            return
        gate.timed_out += 1
        self.transport.close()

    def _stop_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _leave_gate(self) -> None:
        self._stop_timer()
        if self._gate is not None:
            self._gate.leave(self)
            self._gate = None


class GuardedH11Protocol(_Guarded, H11Protocol):
    pass


if HttpToolsProtocol is not None:
    class GuardedHttpToolsProtocol(_Guarded, HttpToolsProtocol):
        pass

    GuardedProtocol: type[asyncio.Protocol] = GuardedHttpToolsProtocol
else:  # pragma: no cover
    GuardedProtocol = GuardedH11Protocol

PROTOCOL = "gateway.edge.connections:GuardedProtocol"  # uvicorn's `http` for `gateway serve`
