"""Plain ASGI middleware: every request gets an id, every response names it (and forbids MIME sniffing)."""
from __future__ import annotations

import uuid

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-gateway-request-id"


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def request_id_of(request: Request) -> str:
    return request.scope["state"]["request_id"]


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        headers = [(REQUEST_ID_HEADER.encode(), request_id.encode()), (b"x-content-type-options", b"nosniff")]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *headers]
            await send(message)

        await self.app(scope, receive, send_with_id)
