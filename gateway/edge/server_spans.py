"""Plain ASGI middleware: a server span around each request, continuing the caller's W3C trace.

The span is named by the route (`POST /v1/chat/completions`) and, for a model
request, carries its run as the access log does: tenant, model, deployment,
wire format and how the run ended. A run that failed fails the span, a stream
that broke after its 200 included; otherwise only a 5xx does, as HTTP's
conventions have it. Health probes and metric scrapes are not traced.
"""
from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.ops.tracing import PROPAGATOR, Tracing, mark_failed
from gateway.pipeline.run_recorder import recorders_of

_UNTRACED = frozenset({"/healthz", "/readyz", "/metrics"})  # probes and scrapes: noise in every trace view


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope.get("headers") or ()
            if name in (b"traceparent", b"tracestate", b"user-agent")}


def _run_attributes(scope: Scope) -> tuple[dict[str, Any], str | None]:
    """What the request's run says of itself, and its error type if it failed."""
    recorders = recorders_of(scope)
    if not recorders:
        return {}, None
    recorder = recorders[-1]
    start, outcome = recorder.start, recorder.outcome
    attributes: dict[str, Any] = {
        "gateway.tenant": start.tenant, "gateway.model": start.model, "gateway.wire_format": start.wire_format,
        "gateway.stream": start.stream,
        "gateway.deployment": start.upstream_model,  # until the run names the deployment that answered
    }
    if start.session_label:
        attributes["gateway.conversation_label"] = start.session_label
    if outcome is None:
        return attributes, None
    attributes["gateway.run_status"] = outcome.status
    if outcome.deployment is not None:
        attributes["gateway.deployment"] = outcome.deployment
        attributes["gateway.upstream_tries"] = max(1, len(outcome.attempts))
    return attributes, (outcome.error_type or outcome.status) if outcome.status != "ok" else None


class TracingMiddleware:
    """A server span around each traced request."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracer = self.tracing.tracer
        if tracer is None or scope["type"] != "http" or scope.get("path") in _UNTRACED:
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        parent = PROPAGATOR.extract(headers)
        method = scope.get("method", "GET")
        attributes = {"http.request.method": method, "url.path": scope.get("path", ""),
                      "url.scheme": scope.get("scheme", "http"), "network.protocol.version": scope.get("http_version", "")}
        if scope.get("client"):
            attributes["client.address"] = scope["client"][0]
        if "user-agent" in headers:
            attributes["user_agent.original"] = headers["user-agent"]
        request_id = (scope.get("state") or {}).get("request_id")
        if request_id:
            attributes["gateway.request_id"] = request_id
        span = tracer.start_span(method, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        failure: BaseException | None = None
        try:
            await self.app(scope, receive, send_status)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            otel_context.detach(token)
            self._finish(span, scope, status, failure)

    @staticmethod
    def _finish(span: Span, scope: Scope, status: int, failure: BaseException | None) -> None:
        route = getattr(scope.get("route"), "path", None)
        if route:
            span.update_name(f"{scope.get('method', 'GET')} {route}")
            span.set_attribute("http.route", route)
        if status:
            span.set_attribute("http.response.status_code", status)
        run, run_error = _run_attributes(scope)
        span.set_attributes(run)
        if failure is not None and not status:
            mark_failed(span, failure)
        elif run_error is not None:  # a failed run, streams that failed after their 200 included
            span.set_attribute("error.type", run_error)
            span.set_status(Status(StatusCode.ERROR, run_error))
        elif status >= 400:  # as HTTP's conventions have it: a server's span fails on its own faults only
            span.set_attribute("error.type", str(status))
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
        span.end()
