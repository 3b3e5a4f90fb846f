"""What the routers reach through `app.state`: built once, in the lifespan."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Callable

from fastapi import Depends, Request

from gateway.auth import KeyRing, Principal, authenticate
from gateway.config import Settings
from gateway.upstream import UpstreamClient
from policies.policy import Policy
from storage.records import RecordStore


@dataclass(frozen=True)
class Services:
    settings: Settings
    store: RecordStore
    upstream: UpstreamClient
    keyring: KeyRing
    policies: dict[str, Policy]  # by tenant id
    clock: Callable[[], float]  # unix seconds; tests move time forward


def get_services(request: Request) -> Services:
    return request.app.state.services


def get_principal(request: Request) -> Principal:
    services: Services = request.app.state.services
    return authenticate(services.keyring, request.headers.get("authorization"))


ServicesDep = Annotated[Services, Depends(get_services)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
