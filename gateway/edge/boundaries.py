"""Plain ASGI middleware at the edge: hostile request lines, and faults of our own.

`RequestSanity` refuses a path, query parameter or header holding NUL or a
lone surrogate (what storage cannot hold) with a 400 that names it, before any
route sees it. `ErrorBoundary` answers any exception that escapes a route with
a 500 in the caller's format and returns normally, so the server keeps the
keep-alive connection (Starlette's own handler re-raises, and the server then
drops the connection). `StartupFailures` tells a start that fails in one line
(`gateway: cannot start: database URL: why`) instead of Starlette's traceback,
which goes to the debug log.
"""
from __future__ import annotations

import logging
import re
import sys
from urllib.parse import parse_qsl

from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config import Settings
from gateway.errors import GatewayError, InvalidRequest
from gateway.ops.logs import note_refusal
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.outages import failure_line
from gateway.pipeline.run_recorder import internal_error, runs_recorded
from gateway.wire.formats import error_response

log = logging.getLogger("gateway")
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


def _check(value: str, param: str) -> None:
    if _BAD_TEXT.search(value):
        raise InvalidRequest(f"{param}: may not contain NUL characters or invalid UTF-8", param=param)


def check_request_line(scope: Scope) -> None:
    _check(scope.get("path", ""), "path")
    query = scope.get("query_string", b"")
    if query:
        text = query.decode("utf-8", "surrogateescape")
        for name, value in parse_qsl(text, keep_blank_values=True, errors="surrogateescape"):
            _check(name, "query")
            _check(value, name)
    for name, value in scope.get("headers", ()):
        if b"\x00" in value:
            raise InvalidRequest(f"header {name.decode('latin-1')}: may not contain NUL characters",
                                 param=name.decode("latin-1"))


def refusal(path: str, error: GatewayError) -> JSONResponse:
    """The error's answer in `path`'s format, its code noted for the request's log lines (the access
    line's `code`)."""
    note_refusal(error.code or error.error_type)
    return error_response(path, error)


class RequestSanity:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                check_request_line(scope)
            except GatewayError as error:
                await refusal(scope.get("path", ""), error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ErrorBoundary:
    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            return  # nobody left to answer
        except Exception as exc:
            error = internal_error(exc, *runs_recorded(scope))
            note_refusal(error.code or error.error_type)
            if error.status_code == 503:  # the database is away: the housekeeping says so, once
                log.debug("%s on %s: %s", error.code, scope.get("path"), error.detail)
            else:
                log.exception("unhandled error on %s", scope.get("path"))
            self.metrics.observe_error(error.code or error.error_type, scope.get("path", ""))
            if started:
                return  # the answer is under way; the server ends the broken response
            await error_response(scope.get("path", ""), error)(scope, receive, send)


class StartupFailures:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def one_line(message: Message) -> None:
            failure = sys.exc_info()[1]  # Starlette sends startup.failed while it handles the exception
            if message["type"] == "lifespan.startup.failed" and failure is not None:
                log.debug("the start failed", exc_info=failure)
                message = {**message, "message": f"gateway: cannot start: {failure_line(failure, self.settings)}"}
            await send(message)

        await self.app(scope, receive, one_line)
