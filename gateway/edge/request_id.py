"""Plain ASGI middleware: every request gets an id, every response names it (and forbids MIME
sniffing), and every request leaves one line in the access log.

A client's own `x-request-id` (visible ASCII, at most 200 characters) is honoured:
it comes back in the response's `x-request-id` and goes into the access log beside
the gateway's id; without one, `x-request-id` is the gateway's id. Every line logged
while the request is served carries its id (gateway/ops/logs.py's request context, which
this middleware opens). The access line names the tenant once a key named one, and
the error code of a refusal; that of a model request carries its run: model, the
deployment that answered, wire format, status, tokens as sent and as forwarded,
usage, cost and the error.
"""
from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.ops.logs import ACCESS_LOGGER, close_request, open_request
from gateway.pipeline.run_recorder import recorders_of

REQUEST_ID_HEADER = "x-gateway-request-id"
CLIENT_REQUEST_ID_HEADER = "x-request-id"
_CLIENT_ID = re.compile(r"^[\x21-\x7e]{1,200}$")
access_log = logging.getLogger(ACCESS_LOGGER)


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def request_id_of(request: Request) -> str:
    return request.scope["state"]["request_id"]


def client_request_id(scope: Scope) -> str | None:
    """The client's `x-request-id`, if it sent a usable one."""
    for name, value in scope.get("headers") or ():
        if name == b"x-request-id":
            text = value.decode("latin-1")
            return text if _CLIENT_ID.match(text) else None
    return None


def _run_fields(scope: Scope) -> dict[str, Any]:
    recorders = recorders_of(scope)
    if not recorders:
        return {}
    recorder = recorders[-1]
    start, outcome = recorder.start, recorder.outcome
    fields: dict[str, Any] = {
        "tenant": start.tenant, "model": start.model, "deployment": start.upstream_model,
        "wire_format": start.wire_format, "stream": start.stream, "conversation_label": start.session_label,
    }
    if outcome is not None:
        fields.update({
            "run_status": outcome.status, "tokens_sent": outcome.tokens_original,
            "tokens_forwarded": outcome.tokens_forwarded, "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens, "cached_tokens": outcome.cached_tokens,
            "cost_usd": outcome.cost_usd, "upstream_latency_ms": round(outcome.latency_ms, 3),
            "error_type": outcome.error_type,
        })
        if outcome.error_type is not None:
            fields["code"] = outcome.error_type  # the gateway error code the run ended with
        if outcome.deployment is not None:
            fields["deployment"] = outcome.deployment
            fields["upstream_model"] = outcome.upstream_model
            fields["upstream_tries"] = max(1, len(outcome.attempts))
    return fields


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = new_request_id()
        context, token = open_request(request_id)
        theirs = client_request_id(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        headers = [(REQUEST_ID_HEADER.encode(), request_id.encode()),
                   (CLIENT_REQUEST_ID_HEADER.encode(), (theirs or request_id).encode()),
                   (b"x-content-type-options", b"nosniff")]
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), *headers]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if access_log.isEnabledFor(logging.INFO):
                fields = {**context.fields(), "client_request_id": theirs, "method": scope.get("method"),
                          "path": scope.get("path"), "status": status or None,
                          "latency_ms": round((time.perf_counter() - started) * 1000, 3), **_run_fields(scope)}
                access_log.info("%s %s %s", scope.get("method"), scope.get("path"), status or "-",
                                extra={"fields": fields})
        close_request(token)  # only on a normal return: the server's own line on an escaping error names it too
