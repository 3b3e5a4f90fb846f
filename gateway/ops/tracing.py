"""OpenTelemetry traces: one trace per request, exported over OTLP when `telemetry.otlp_endpoint` is set.

The tracer lives on a `Tracing` object that the app owns (never the process-wide
provider), so two apps in one process, tests among them, keep their spans apart.
A model request's trace: the server span (`TracingMiddleware`, continuing a
caller's W3C `traceparent`, gateway/edge/server_spans.py), and under it `gateway.ingest`, `gateway.assembly`,
one `chat {model}` client span per upstream call (gateway/upstream/tracing.py,
which sends `traceparent` on), and `gateway.pipeline.rehydration` for each hidden round
the gateway answers itself. Off, every helper here is a no-op and neither the
SDK nor the exporter is imported.
"""
from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.config import TelemetrySettings
from gateway.errors import GatewayError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

PROPAGATOR = TraceContextTextMapPropagator()
_VERSION = "0.1.0"


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base URL (as OTEL_EXPORTER_OTLP_ENDPOINT is read)."""
    if endpoint.rstrip("/").endswith("/v1/traces"):
        return endpoint
    return endpoint.rstrip("/") + "/v1/traces"


def error_type(exc: BaseException) -> str:
    """`error.type`: the gateway's error code (what the client was told), else the exception's class."""
    if isinstance(exc, GatewayError):
        return exc.code or exc.error_type
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled"  # the client went away (or its request was cancelled) before the answer was whole
    return type(exc).__qualname__


def mark_failed(span: Span, exc: BaseException) -> None:
    kind = error_type(exc)
    span.set_attribute("error.type", kind)
    # The gateway's own messages say what failed; a foreign exception's text could carry anything.
    span.set_status(Status(StatusCode.ERROR, str(exc)[:300] if isinstance(exc, GatewayError) else kind))


class Tracing:
    """The app's tracer (None while telemetry is off) and what its spans may record."""

    def __init__(self, settings: TelemetrySettings, exporter: "SpanExporter | None" = None) -> None:
        self.settings = settings
        self.capture_content = settings.capture_content
        self._exporter = exporter  # tests: spans go here, synchronously, whatever the endpoint
        self._provider: TracerProvider | None = None
        self.tracer: trace.Tracer | None = None

    @property
    def configured(self) -> bool:
        return self._exporter is not None or self.settings.otlp_endpoint is not None

    def start(self) -> None:
        """Build the provider (in the lifespan: the batch exporter runs a thread)."""
        if not self.configured or self._provider is not None:
            return
        # Imported here, and only when configured: the exporter brings protobuf (about 0.2 s).
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        resource = Resource.create({"service.name": self.settings.service_name, "service.version": _VERSION})
        provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(self.settings.sample_ratio)))
        if self._exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(self._exporter))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            assert self.settings.otlp_endpoint is not None
            exporter = OTLPSpanExporter(endpoint=traces_url(self.settings.otlp_endpoint),
                                        headers=dict(self.settings.headers) or None)
            provider.add_span_processor(BatchSpanProcessor(exporter))
        self._provider = provider
        self.tracer = provider.get_tracer("context-gateway", _VERSION)

    def force_flush(self, timeout_millis: int = 10_000) -> bool:
        return self._provider.force_flush(timeout_millis) if self._provider is not None else True

    def shutdown(self) -> None:
        """Export what is still queued, then stop (the end of the lifespan)."""
        if self._provider is not None:
            self._provider.shutdown()
        self._provider, self.tracer = None, None

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Span]:
        """An internal span, current inside the block; failed with the exception's type if one escapes."""
        if self.tracer is None:
            yield trace.INVALID_SPAN  # takes attributes and drops them
            return
        with self.tracer.start_as_current_span(name, attributes=attributes, record_exception=False,
                                               set_status_on_exception=False) as span:
            try:
                yield span
            except BaseException as exc:
                mark_failed(span, exc)
                raise


OFF = Tracing(TelemetrySettings())
