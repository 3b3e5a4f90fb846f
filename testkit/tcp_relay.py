"""Loopback TCP relays in front of a server (bench/delayed_link.py slows one; tests/storage/
test_folded_transactions.py counts what passes): the accepting loop they share."""
from __future__ import annotations

import socket
from typing import Callable


def relay_clients(listener: socket.socket, target: tuple[str, int],
                  start: Callable[[socket.socket, socket.socket], None]) -> None:
    """Accept on `listener` until it is closed; connect each client to `target` and hand both sockets
    (client, server; Nagle off) to `start`, which relays between them."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        server = socket.create_connection(target)
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start(client, server)
