"""Plain ASGI middleware at the edge of the server: sockets, request lines, bodies, request ids, server spans."""
