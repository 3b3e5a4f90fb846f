"""Plain ASGI middleware: a request body arrives in time, and bodies hold a bounded share of memory.

`RequestBodies` hands the app a `receive` that

- gives up on a body that has not all arrived `server.body_timeout_seconds` after the request's
  headers: 408 `request_timeout` in the caller's format, and the connection is closed (a client
  sending one byte a minute is not waited on for ever);
- counts the request's body against the process's `BodyBudget` (`server.max_buffered_request_bytes`)
  from the moment the app starts reading it until the response starts (or the request ends): a
  declared `content-length` is taken whole at once, a chunked body as it comes. A body that does not
  fit is answered 503 `server_busy` with `retry-after` in the caller's format (a declared one before
  any of it is read).

Both refusals are raised from `receive` as `GatewayError`s, so the app's handler answers them in the
format of the path, exactly as a refusal of the route's own. When a request ends, the `Trimmer` hears
how long its body was (gateway/ops/memory.py). Once the body is complete, `receive` is the
server's again (a stream waits on it for the client to leave, for as long as the stream lasts).
"""
from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import RequestTimeout, ServiceUnavailable
from gateway.ops.memory import Trimmer

RETRY_AFTER_SECONDS = 1


class BodyBudget:
    """Bytes of request bodies this process holds at once, at most `limit` (a body larger than that is
    let through when it is the only one: so is every body the route would take)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, amount: int) -> bool:
        if self.held and self.held + amount > self.limit:
            return False
        self.held += amount
        return True

    def give_back(self, amount: int) -> None:
        self.held -= amount


def declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class _Body:
    """One request's body as the app reads it: its deadline and what it holds of the budget."""

    def __init__(self, receive: Receive, budget: BodyBudget, timeout: float, declared: int | None) -> None:
        self.receive = receive
        self.budget = budget
        self.timeout = timeout
        self.deadline = asyncio.get_running_loop().time() + timeout
        self.declared = declared
        self.held = 0
        self.counted = 0  # bytes received so far
        self.complete = False
        self.released = False

    async def __call__(self) -> Message:
        if self.complete:
            return await self.receive()
        if self.counted == 0 and self.declared and not self.released:
            self._hold(self.declared)
        try:
            async with asyncio.timeout_at(self.deadline):
                message = await self.receive()
        except TimeoutError:
            self.release()
            raise RequestTimeout(f"The request body did not arrive within {self.timeout:g} s of its headers.",
                                 headers={"connection": "close"}) from None
        if message["type"] != "http.request":
            self.complete = True
            return message
        self.counted += len(message.get("body", b""))
        if self.counted > self.held and not self.released:
            self._hold(self.counted - self.held)
        self.complete = not message.get("more_body", False)
        return message

    def _hold(self, amount: int) -> None:
        if not self.budget.take(amount):
            self.release()
            raise ServiceUnavailable("The gateway is holding as many request bytes as it may; try again shortly.",
                                     code="server_busy", retry_after=RETRY_AFTER_SECONDS)
        self.held += amount

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.budget.give_back(self.held)
            self.held = 0


class RequestBodies:
    def __init__(self, app: ASGIApp, timeout_seconds: float, budget: BodyBudget, max_body_bytes: int,
                 trimmer: Trimmer | None = None) -> None:
        self.app = app
        self.timeout = timeout_seconds
        self.budget = budget
        self.max_body_bytes = max_body_bytes
        self.trimmer = trimmer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            declared = None  # refused by the route as too large, unread; counted as it comes if read at all
        body = _Body(receive, self.budget, self.timeout, declared)

        async def releasing(message: Message) -> None:
            if message["type"] == "http.response.start":
                body.release()
            await send(message)

        try:
            await self.app(scope, body, releasing)
        finally:
            body.release()
            if self.trimmer is not None:
                self.trimmer.finished(body.counted)
