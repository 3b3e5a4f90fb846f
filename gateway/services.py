"""What the routers reach through `app.state`: built once, in the lifespan."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Callable

from fastapi import Depends, Request

from gateway.access.auth import KeyRing, Principal, api_key_beside_bearer, authenticate, bearer_key
from gateway.access.budgets import Budgets
from gateway.access.dashboard_sessions import COOKIE, SessionSigner, signed_in
from gateway.config import Settings
from gateway.evaluation.shadows import Shadows
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.tracing import OFF, Tracing
from gateway.pipeline.assembly_bases import RecentAssemblies
from gateway.upstream.seam import UpstreamClient
from policies.canonical import NodeIds
from policies.policy import Policy
from storage.ratelimit import RateLimiter
from storage.records import RecordStore
from storage.redis_link import RedisLink


@dataclass(frozen=True)
class Services:
    settings: Settings
    store: RecordStore
    upstream: UpstreamClient
    keyring: KeyRing
    policies: dict[str, Policy]  # by tenant id
    clock: Callable[[], float]  # unix seconds; tests move time forward
    sessions: SessionSigner
    metrics: GatewayMetrics
    limiter: RateLimiter
    budgets: Budgets
    recent_assemblies: RecentAssemblies = field(default_factory=RecentAssemblies)
    node_ids: NodeIds = field(default_factory=NodeIds)  # node ids of messages seen before, by their exact JSON
    tracing: Tracing = OFF  # spans of model requests (gateway/ops/tracing.py)
    redis: RedisLink | None = None  # behind the limiter and the budgets' counters, when configured
    shadows: Shadows | None = None  # shadow comparisons (gateway/evaluation/shadows.py)


async def get_services(request: Request) -> Services:
    return request.app.state.services


def get_principal(request: Request) -> Principal:
    """The bearer key's principal; for reads without one, the dashboard's live session (its cookie).
    (A sync dependency: FastAPI runs it in a worker thread, where a made key may be read from the database.)"""
    services: Services = request.app.state.services
    authorization = request.headers.get("authorization")
    api_key = api_key_beside_bearer(request.headers, request.url.path, request.query_params)
    if bearer_key(authorization) is None and api_key is None and request.method == "GET":
        principal = signed_in(services.store, services.sessions, services.keyring, request.cookies.get(COOKIE),
                              services.clock())
        if principal is not None:
            return principal
    return authenticate(services.keyring, authorization, api_key)


ServicesDep = Annotated[Services, Depends(get_services)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
