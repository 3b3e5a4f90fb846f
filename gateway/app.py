"""`create_app(settings)`: wiring only. Engines and clients are made in the lifespan."""
from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.access.auth import KeyRing, metrics_caller
from gateway.access.budgets import Budgets
from gateway.access.dashboard_sessions import SessionSigner
from gateway.access.key_cache import DatabaseKeys
from gateway.api import admin as admin_api
from gateway.api import compactions as compactions_api
from gateway.api import evaluation as evaluation_api
from gateway.api import gemini_routes, model_routes
from gateway.api import keys as keys_api
from gateway.api import records as records_api
from gateway.config import Settings, load_settings, tenant_policies
from gateway.dashboard import pages as dashboard
from gateway.dashboard.headers import DashboardHeaders
from gateway.evaluation.shadows import Shadows
from gateway.edge.boundaries import ErrorBoundary, RequestSanity, StartupFailures, refusal
from gateway.edge.connections import GATE_STATE, ConnectionGate, usable_connections
from gateway.edge.request_bodies import BodyBudget, RequestBodies
from gateway.edge.request_id import RequestIdMiddleware
from gateway.edge.server_spans import TracingMiddleware
from gateway.errors import GatewayError, InvalidRequest, NotFound, key_unavailable
from gateway.ops.housekeeping import Housekeeping
from gateway.ops.logs import serve_logging
from gateway.ops.memory import MALLOC_TRIM, Trimmer
from gateway.ops.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.outages import counters as shared_counters
from gateway.ops.outages import readiness
from gateway.ops.reload import Reloader
from gateway.ops.startup_line import log_started
from gateway.ops.tracing import Tracing
from gateway.pipeline.run_recorder import RunGuard, outcomes_written
from gateway.services import Services
from gateway.threads import aside
from gateway.upstream.deployments import RoutedUpstream
from gateway.upstream.encodings import use_bundled_encodings
from gateway.upstream.seam import UpstreamClient
from gateway.upstream.tracing import TracedUpstream
from policies.tokens import encoding, lighten_loaded
from storage.blobs import BlobStore, DirectoryBlobStore
from storage.database import make_engine
from storage.encryption import EnvelopeError, UnknownKey
from storage.records import RecordStore

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

GC_YOUNG_OBJECTS = 20_000  # the collector's first threshold while serving (Python's default: 700)


class _ServingCollector:
    """The collector's thresholds while at least one app of the process serves (the thresholds are the
    process's: several apps, as in the tests, share them); the earlier ones once the last app stops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._apps = 0
        self._before: tuple[int, int, int] | None = None

    def serving(self) -> None:
        with self._lock:
            if self._apps == 0:
                self._before = gc.get_threshold()
                gc.set_threshold(GC_YOUNG_OBJECTS, 20, 20)
            self._apps += 1

    def stopped(self) -> None:
        with self._lock:
            self._apps -= 1
            if self._apps == 0 and self._before is not None:
                gc.set_threshold(*self._before)


_COLLECTOR = _ServingCollector()


def build_blob_store(settings: Settings) -> BlobStore:
    blobs = settings.storage.blobs
    if blobs.backend == "s3":
        from storage.s3_blobs import S3BlobStore  # boto3 only where it is used

        return S3BlobStore.connect(
            blobs.bucket or "", prefix=blobs.prefix, endpoint_url=blobs.endpoint_url, region=blobs.region,
            access_key_id=blobs.access_key_id, secret_access_key=blobs.secret_access_key)
    return DirectoryBlobStore(settings.resolve_path(settings.storage.blob_folder))


def build_store(settings: Settings, clock: Callable[[], float] = time.time) -> RecordStore:
    engine = make_engine(settings.storage_url(), pool_size=settings.storage.pool_size)
    blobs = build_blob_store(settings)
    return RecordStore(engine, blobs, inline_max_bytes=settings.storage.inline_max_bytes, clock=clock,
                       encryption=settings.storage.encryption_keys())


def default_upstream(settings: Settings) -> UpstreamClient:
    from gateway.upstream.litellm_client.client import LiteLLMUpstream  # LiteLLM's import is slow: only when serving

    # None: on unless GATEWAY_DIRECT_TRANSPORT=0 in the environment; the config can only turn it off
    return LiteLLMUpstream(direct_transport=None if settings.server.direct_transport else False)


def _on_hangup(reloader: Reloader) -> bool:
    """SIGHUP reloads the config (where this process may take signals: the main thread, POSIX)."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(asyncio.to_thread(reloader.reload)))
    except (ValueError, RuntimeError, NotImplementedError, AttributeError):
        return False
    return True


def _load_encodings() -> None:
    """After the warm-up: the gateway's encoding loaded (tiktoken's first load takes a few hundred ms), it
    and those LiteLLM loaded lightened, and the pages their ranks held given back."""
    encoding()
    lighten_loaded()
    gc.collect()
    if MALLOC_TRIM is not None:
        MALLOC_TRIM()


def _current_settings(app: FastAPI) -> Settings | None:
    """The settings now in force (a reload swaps them); None before the app is up."""
    services = getattr(app.state, "services", None)
    return services.settings if services is not None else None


CONFIG_ENV = "GATEWAY_CONFIG"  # the config file of `gateway serve --workers N`'s processes


def app_from_environment() -> FastAPI:
    """The app of one worker process of `gateway serve --workers N` (uvicorn calls this in each, once
    it has applied the logging config `gateway serve` gave it)."""
    settings = load_settings(os.environ[CONFIG_ENV])
    serve_logging(settings.log_level, settings.log_format, settings.access_log)
    return create_app(settings)


def create_app(
    settings: Settings,
    *,
    upstream: UpstreamClient | None = None,
    store: RecordStore | None = None,
    clock: Callable[[], float] = time.time,
    span_exporter: SpanExporter | None = None,
) -> FastAPI:
    """`span_exporter`: where spans go, whatever `telemetry` says (tests: an in-memory exporter)."""
    use_bundled_encodings()  # before the first token is counted
    metrics = GatewayMetrics()
    tracing = Tracing(settings.telemetry, span_exporter)
    # The connections and request bytes this process holds (gateway/edge/connections.py, request_bodies.py).
    gate = ConnectionGate(settings.server.max_connections, settings.server.header_timeout_seconds)
    budget = BodyBudget(settings.server.max_buffered_request_bytes)
    metrics.observe_edge(gate, budget)
    lifespan = _Lifespan(settings, metrics, tracing, gate, upstream, store, clock)
    docs = settings.server.docs
    app = FastAPI(title="Context gateway", version="0.1.0", lifespan=lifespan, docs_url="/docs" if docs else None,
                  redoc_url=None, openapi_url="/openapi.json" if docs else None)
    _add_middleware(app, settings, metrics, tracing, budget)
    _add_routes(app, settings, metrics)
    _add_error_handlers(app, metrics)
    return app


class _Lifespan:
    """What the app starts when it begins serving and stops when it ends, each in its order: the store,
    the shared counters, this instance's registration and housekeeping, tracing, the upstream client,
    the services, the config's reloads; then the collector's settings for serving."""

    def __init__(self, settings: Settings, metrics: GatewayMetrics, tracing: Tracing, gate: ConnectionGate,
                 upstream: UpstreamClient | None, store: RecordStore | None, clock: Callable[[], float]) -> None:
        self.settings, self.metrics, self.tracing, self.gate = settings, metrics, tracing, gate
        self.upstream, self.store, self.clock = upstream, store, clock
        self.shadows: Shadows | None = None

    @asynccontextmanager
    async def __call__(self, app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        await self._start(app)
        try:
            yield {GATE_STATE: self.gate}  # uvicorn hands the lifespan state to each connection's protocol
        finally:
            await self._stop()

    async def _start(self, app: FastAPI) -> None:
        settings, clock, tracing = self.settings, self.clock, self.tracing
        self.gate.limit = usable_connections(settings.server.max_connections)
        self.owned_store = self.store is None
        record_store = self.record_store = self.store or build_store(settings, clock)
        await aside(record_store.create_schema)
        await aside(record_store.blobs.check)  # a missing bucket stops the start, not a capture
        counters = self.counters = shared_counters(settings, self.metrics, clock)
        self.probing = await counters.start(settings)  # Redis down under `refuse` stops the start
        await aside(record_store.register_instance)
        housekeeping = Housekeeping(record_store, settings.server, lambda: _current_settings(app), clock)
        await housekeeping.run_once()  # what a crashed predecessor left pending
        tracing.start()
        inner = self.upstream or default_upstream(settings)
        # Each try of a routed call is a span of its own (the traced client sits inside the routing).
        traced = TracedUpstream(inner, tracing.tracer, tracing.capture_content) if tracing.tracer else inner
        client = self.client = RoutedUpstream(traced, settings, counters.limiter)
        await client.warm_up()
        await aside(_load_encodings)
        self.shadows = Shadows(client, record_store, clock, self.metrics)
        app.state.services = Services(
            settings=settings,
            store=record_store,
            upstream=client,
            keyring=KeyRing(settings, DatabaseKeys(record_store), clock),
            policies=tenant_policies(settings),
            clock=clock,
            sessions=SessionSigner(settings.dashboard.session_secret),
            metrics=self.metrics,
            limiter=counters.limiter,
            budgets=Budgets(counters.spend, record_store, clock),
            tracing=tracing,
            redis=counters.redis,
            shadows=self.shadows,
        )
        log_started(settings, app.state.services.policies)
        self.beating = asyncio.create_task(housekeeping.run_forever())
        reloader = Reloader(app, settings.source) if Path(settings.source).is_file() else None
        app.state.reloader = reloader
        self.watching = asyncio.create_task(reloader.watch(2.0)) if reloader and settings.server.watch_config else None
        self.hangup = reloader is not None and _on_hangup(reloader)
        # What startup built (LiteLLM, SQLAlchemy, tiktoken: hundreds of thousands of objects) lives
        # as long as the process: out of the collector's sight, a collection that a large request
        # triggers scans what that request made instead of everything (bench/proxy_compare.py's
        # 1,000-message request spends noticeably less time in the collector).
        gc.collect()
        gc.freeze()
        # And the collector runs every GC_YOUNG_OBJECTS container allocations instead of every 700: a
        # 1,000-message request allocates tens of thousands, and under load at 20 clients the default
        # spent 3.9 s of 18 in the collector (gc.callbacks), 0.7 s at this threshold; the gateway's
        # CPU per request went from 106 to 93 ms. Garbage without cycles is freed at once either way.
        _COLLECTOR.serving()

    async def _stop(self) -> None:
        _COLLECTOR.stopped()
        self.beating.cancel()
        if self.watching is not None:
            self.watching.cancel()
        if self.hangup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        await aside(self.record_store.retire_instance)
        if self.probing is not None:
            self.probing.cancel()
        await self.counters.close()
        if self.shadows is not None:
            await self.shadows.stop()  # before the upstream client closes under them
        if self.upstream is None:
            await self.client.aclose()  # the direct transport's connection pool
        if self.owned_store:
            self.record_store.engine.dispose()
        await aside(self.tracing.shutdown)  # exports what is still queued


def _add_middleware(app: FastAPI, settings: Settings, metrics: GatewayMetrics, tracing: Tracing,
                    budget: BodyBudget) -> None:
    """The middleware stack, in one place.

    Outermost first (add_middleware prepends): a start that fails is told in one line (the lifespan's
    only concern); request ids wrap everything; every dashboard response, refusals and errors included,
    gets the dashboard's security headers; the server span sees the request id and the final status;
    the error boundary answers what escapes a route; the run guard finishes any run left open; request
    lines storage cannot hold are refused before a route sees them; a body that is late or does not fit
    in memory is refused as the route reads it."""
    app.add_middleware(RequestBodies, timeout_seconds=settings.server.body_timeout_seconds, budget=budget,
                       max_body_bytes=settings.server.max_body_bytes, trimmer=Trimmer())
    app.add_middleware(RequestSanity)
    app.add_middleware(RunGuard)
    app.add_middleware(ErrorBoundary, metrics=metrics)
    app.add_middleware(TracingMiddleware, tracing=tracing)
    app.add_middleware(DashboardHeaders)
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(StartupFailures, settings=settings)


def _add_routes(app: FastAPI, settings: Settings, metrics: GatewayMetrics) -> None:
    """The routers (model routes, records, dashboard, admin, keys) and the probes: health, readiness, metrics."""
    app.include_router(model_routes.router)
    app.include_router(gemini_routes.router)
    app.include_router(records_api.router)
    app.include_router(evaluation_api.router)
    app.include_router(compactions_api.router)
    app.include_router(dashboard.router)
    app.include_router(admin_api.router)
    app.include_router(keys_api.router)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request, degraded: str | None = None) -> JSONResponse:
        services: Services = request.app.state.services
        # `redis` is read at start only; `?degraded=ok`: 200 while serving on per-process limits
        return await readiness(services.store, services.redis, settings, degraded_ok=degraded == "ok")

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint(request: Request) -> Response:
        services: Services = request.app.state.services
        if services.settings.server.metrics_token is not None:
            metrics_caller(services.keyring, services.settings.server.metrics_token,
                           request.headers.get("authorization"))
        await outcomes_written()
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)


def _add_error_handlers(app: FastAPI, metrics: GatewayMetrics) -> None:
    """Errors rendered once, in the caller's wire format (`refusal`): the gateway's own, a sealed record
    that cannot be opened, a request FastAPI refused, and Starlette's HTTP errors (404 included)."""

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, error: GatewayError) -> JSONResponse:
        metrics.observe_error(error.code or error.error_type, request.url.path)
        return refusal(request.url.path, error)

    @app.exception_handler(EnvelopeError)
    async def sealed_record_error(request: Request, error: EnvelopeError) -> JSONResponse:
        if isinstance(error, UnknownKey):
            gateway = key_unavailable("A stored record", error)
        else:
            gateway = GatewayError("A stored record failed its integrity check.", code="record_corrupted")
        metrics.observe_error(gateway.code or gateway.error_type, request.url.path)
        return refusal(request.url.path, gateway)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return refusal(request.url.path, InvalidRequest(f"{param}: {first.get('msg')}", param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == 404:
            gateway = NotFound(f"Unknown path {request.url.path}.", code="unknown_url")
        else:
            gateway = GatewayError(str(error.detail), status_code=error.status_code, code="http_error")
            gateway.error_type = "invalid_request_error" if error.status_code < 500 else "api_error"
        return refusal(request.url.path, gateway)
