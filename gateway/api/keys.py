"""Keys made through the API (an admin key): create (the key is shown once), list, read, revoke.

A key is `gw-` and 32 random bytes (urlsafe base64); the database keeps its
sha256 and its first characters (`prefix`), never the key. It speaks for a
tenant of the config, optionally for fewer models, with its own budget and
per-minute limits on top of the tenant's.
"""
from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.access.auth import API_KEY_PREFIX, Principal
from gateway.access.budgets import periods
from gateway.config import BudgetSettings, LimitSettings
from gateway.errors import InvalidRequest, NotFound, PermissionDenied
from gateway.pipeline.request_path import read_body
from gateway.services import PrincipalDep, Services, ServicesDep
from gateway.threads import aside
from gateway.wire.json_body import check_text, param_path, parse_json_object
from storage.api_keys import ApiKeyRecord

router = APIRouter(prefix="/api/keys")
_PREFIX_CHARS = 6
_MAX_BODY_BYTES = 64 * 1024


class NewKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(min_length=1, max_length=128)
    name: str | None = Field(None, min_length=1, max_length=256)
    expires_at: datetime | None = None  # ISO 8601; without a zone, UTC
    models: list[str] | None = None  # None: the tenant's models
    budget: BudgetSettings = BudgetSettings()
    limits: LimitSettings = LimitSettings()

    @field_validator("expires_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


def _admin(principal: Principal) -> None:
    if not principal.is_admin:
        raise PermissionDenied("managing API keys needs an admin key")


def _checked(services: Services, body: dict[str, Any]) -> NewKey:
    try:
        new = NewKey.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = param_path(tuple(first["loc"]))
        message = "is required" if first["type"] == "missing" else first["msg"]
        raise InvalidRequest(f"{param}: {message}", param=param) from exc
    if new.name is not None:
        check_text(new.name, "name")  # no NUL, no lone surrogate: every store can hold it
    tenant = next((t for t in services.settings.tenants if t.id == new.tenant), None)
    if tenant is None:
        raise InvalidRequest(f"tenant: no tenant {new.tenant!r} in the config", param="tenant",
                             code="unknown_tenant")
    for model in new.models or []:
        entry = services.settings.model(model)
        if entry is None or entry.name != model:
            raise InvalidRequest(f"models: no model {model!r} in the config", param="models")
        if tenant.models is not None and model not in tenant.models:
            raise InvalidRequest(f"models: tenant {tenant.id!r} may not use model {model!r}", param="models")
    now = datetime.fromtimestamp(services.clock(), timezone.utc)
    if new.expires_at is not None and new.expires_at <= now:
        raise InvalidRequest("expires_at: the time is already past", param="expires_at")
    return new


async def _with_spend(services: Services, records: list[ApiKeyRecord]) -> list[dict[str, Any]]:
    """Each key as the API shows it, with what its runs cost this UTC day and month."""
    day, month = periods(datetime.fromtimestamp(services.clock(), timezone.utc))
    ids = [r.id for r in records]
    today = await aside(services.store.spend_by_key, day.start, ids)
    this_month = await aside(services.store.spend_by_key, month.start, ids)
    return [{**r.as_dict(), "spend": {"usd_today": today.get(r.id, 0.0), "usd_this_month": this_month.get(r.id, 0.0)}}
            for r in records]


@router.post("")
async def create_key(request: Request, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    """A new key for a tenant of the config: the answer is the only place the key is ever shown."""
    _admin(principal)
    new = _checked(services, parse_json_object(await read_body(request, _MAX_BODY_BYTES)))
    key = API_KEY_PREFIX + secrets.token_urlsafe(32)
    record = ApiKeyRecord(
        id=f"key_{secrets.token_hex(12)}", tenant=new.tenant, name=new.name,
        digest=hashlib.sha256(key.encode()).hexdigest(), prefix=key[:_PREFIX_CHARS],
        created_at=datetime.fromtimestamp(services.clock(), timezone.utc), expires_at=new.expires_at,
        revoked_at=None, models=tuple(new.models) if new.models is not None else None,
        budget=new.budget.model_dump(exclude_none=True), limits=new.limits.model_dump(exclude_none=True))
    await aside(services.store.create_api_key, record)
    if services.keyring.database is not None:
        services.keyring.database.forget(record.digest)  # a lookup that just missed it here
    return {**(await _with_spend(services, [record]))[0], "key": key}


@router.get("")
async def list_keys(principal: PrincipalDep, services: ServicesDep, tenant: str | None = None) -> dict[str, Any]:
    _admin(principal)
    records = await aside(services.store.api_keys, tenant)
    return {"object": "list", "data": await _with_spend(services, records)}


async def _existing(services: Services, key_id: str) -> ApiKeyRecord:
    record = await aside(services.store.api_key, key_id)
    if record is None:
        raise NotFound(f"No API key with id '{key_id}'.", param="key_id", code="api_key_not_found")
    return record


@router.get("/{key_id}")
async def get_key(key_id: str, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    _admin(principal)
    return (await _with_spend(services, [await _existing(services, key_id)]))[0]


@router.delete("/{key_id}")
async def revoke_key(key_id: str, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    """Revoke a key: refused here at once, and by every other replica within a second
    (gateway/access/key_cache.py)."""
    _admin(principal)
    record = await aside(services.store.revoke_api_key, key_id)
    if record is None:
        raise NotFound(f"No API key with id '{key_id}'.", param="key_id", code="api_key_not_found")
    if services.keyring.database is not None:
        services.keyring.database.forget(record.digest)
    return (await _with_spend(services, [record]))[0]

