"""A loopback TCP relay that holds every chunk it passes for a while: a database on another host, as
seen from this one (bench/capture_path.py `--link-delay-ms`). Loopback answers in tens of microseconds,
where a database across a network answers in a few hundred: what a round trip fewer saves there does
not show here without it.

    with DelayedLink("127.0.0.1", 5432, one_way_ms=0.25) as link:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{link.port}/test"

Each direction is its own thread: a chunk read is forwarded `one_way_ms` after it arrived (chunks keep
their order; a chunk that arrived while an earlier one waited waits only for what is left of its own
delay), so a round trip takes about twice `one_way_ms` more than it did.
"""
from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Any

from testkit.tcp_relay import relay_clients


class DelayedLink:
    def __init__(self, host: str, port: int, one_way_ms: float) -> None:
        self._target = (host, port)
        self._delay = one_way_ms / 1000
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []

    def __enter__(self) -> "DelayedLink":
        threading.Thread(target=self._accept, name="delayed-link", daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._listener.close()
        for sock in self._sockets:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        relay_clients(self._listener, self._target, self._relay)

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        self._sockets += [client, server]
        for source, sink in ((client, server), (server, client)):
            held: queue.Queue[tuple[float, bytes]] = queue.Queue()
            threading.Thread(target=self._read, args=(source, held), daemon=True).start()
            threading.Thread(target=self._write, args=(sink, held), daemon=True).start()

    def _read(self, source: socket.socket, held: "queue.Queue[tuple[float, bytes]]") -> None:
        try:
            while data := source.recv(65536):
                held.put((time.perf_counter() + self._delay, data))
        except OSError:
            pass
        held.put((0.0, b""))

    @staticmethod
    def _write(sink: socket.socket, held: "queue.Queue[tuple[float, bytes]]") -> None:
        try:
            while True:
                due, data = held.get()
                if not data:
                    break
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass
