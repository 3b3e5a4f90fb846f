"""`create_app(settings)`: wiring only. Engines and clients are made in the lifespan."""
from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway import chat, dashboard, records_api
from gateway.auth import KeyRing
from gateway.config import Settings, tenant_policies
from gateway.errors import GatewayError, InvalidRequest, NotFound
from gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE, GatewayMetrics
from gateway.request_id import RequestIdMiddleware
from gateway.services import Services
from gateway.sessions import SessionSigner
from gateway.upstream import UpstreamClient
from policies.tokens import encoding
from storage.blobs import DirectoryBlobStore
from storage.database import make_engine
from storage.ratelimit import MemoryRateLimiter, RateLimiter, RedisRateLimiter
from storage.records import RecordStore

log = logging.getLogger("gateway")


def build_store(settings: Settings, clock: Callable[[], float] = time.time) -> RecordStore:
    engine = make_engine(settings.storage_url())
    blobs = DirectoryBlobStore(settings.resolve_path(settings.storage.blob_dir))
    return RecordStore(engine, blobs, inline_max_bytes=settings.storage.inline_max_bytes, clock=clock)


def default_upstream() -> UpstreamClient:
    from gateway.litellm_upstream import LiteLLMUpstream  # LiteLLM's import is slow: only when serving

    return LiteLLMUpstream()


def _error_response(request: Request, error: GatewayError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status_code, headers=error.headers)


def create_app(
    settings: Settings,
    *,
    upstream: UpstreamClient | None = None,
    store: RecordStore | None = None,
    clock: Callable[[], float] = time.time,
) -> FastAPI:
    metrics = GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned_store = store is None
        record_store = store or build_store(settings, clock)
        await run_in_threadpool(record_store.create_schema)
        limiter: RateLimiter = (
            RedisRateLimiter(settings.redis.url, prefix=f"{settings.redis.key_prefix}rl:", clock=clock)
            if settings.redis.url else MemoryRateLimiter(clock)
        )
        client = upstream or default_upstream()
        await client.warm_up()
        await run_in_threadpool(encoding)  # tiktoken's first load takes a few hundred ms
        app.state.services = Services(
            settings=settings,
            store=record_store,
            upstream=client,
            keyring=KeyRing(settings),
            policies=tenant_policies(settings),
            clock=clock,
            sessions=SessionSigner(settings.dashboard.session_secret),
            metrics=metrics,
            limiter=limiter,
        )
        try:
            yield
        finally:
            await limiter.close()
            if owned_store:
                record_store.engine.dispose()

    app = FastAPI(title="Context gateway", version="0.1.0", lifespan=lifespan)
    # Middleware order, outermost first: request ids wrap everything.
    app.add_middleware(RequestIdMiddleware)
    app.include_router(chat.router)
    app.include_router(records_api.router)
    app.include_router(dashboard.router)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> dict[str, str]:
        services: Services = request.app.state.services
        await run_in_threadpool(services.store.ping)
        if isinstance(services.limiter, RedisRateLimiter):
            await services.limiter.ping()
        return {"status": "ready"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, error: GatewayError) -> JSONResponse:
        metrics.observe_error(error.code or error.error_type)
        return _error_response(request, error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return _error_response(request, InvalidRequest(str(error.errors()[0].get("msg"))))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == 404:
            gateway = NotFound(f"Unknown path {request.url.path}.", code="unknown_url")
        else:
            gateway = GatewayError(str(error.detail), status_code=error.status_code, code="http_error")
            gateway.error_type = "invalid_request_error" if error.status_code < 500 else "api_error"
        return _error_response(request, gateway)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        metrics.observe_error("internal_error")
        return _error_response(request, GatewayError("The gateway hit an internal error.", code="internal_error"))

    return app
