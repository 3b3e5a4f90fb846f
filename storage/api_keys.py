"""Keys made through the API: stored as sha256 digests, looked up by digest, revoked by id.

The key itself never reaches the database; `prefix` (its first characters)
tells keys apart in a listing. Spend is summed from `model_runs.cost_usd`,
which names the key each run came with.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping

from sqlalchemy import delete, func, select, update

from storage.record_types import as_utc
from storage.schema import ApiKey, DashboardSession, ModelRun
from storage.store_base import StoreBase

_KEYS = ApiKey.__table__
_RUNS = ModelRun.__table__
_SESSIONS = DashboardSession.__table__


@dataclass(frozen=True)
class ApiKeyRecord:
    id: str
    tenant: str
    name: str | None
    digest: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    models: tuple[str, ...] | None
    budget: dict[str, float]  # usd_per_day, usd_per_month (absent: none)
    limits: dict[str, int]  # requests_per_minute, tokens_per_minute (absent: none)

    def as_dict(self) -> dict[str, Any]:
        """What the API shows of a key: everything but the digest."""
        return {
            "id": self.id,
            "object": "api_key",
            "tenant": self.tenant,
            "name": self.name,
            "prefix": self.prefix,
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
            "models": list(self.models) if self.models is not None else None,
            "budget": dict(self.budget),
            "limits": dict(self.limits),
        }


def api_key_record(row: Mapping[str, Any]) -> ApiKeyRecord:
    return ApiKeyRecord(
        id=row["id"], tenant=row["tenant"], name=row["name"], digest=row["digest"], prefix=row["prefix"],
        created_at=as_utc(row["created_at"]),
        expires_at=as_utc(row["expires_at"]) if row["expires_at"] else None,
        revoked_at=as_utc(row["revoked_at"]) if row["revoked_at"] else None,
        models=tuple(row["models"]) if row["models"] is not None else None,
        budget={k: float(v) for k, v in (row["budget"] or {}).items() if v is not None},
        limits={k: int(v) for k, v in (row["limits"] or {}).items() if v is not None},
    )


class KeyRecords(StoreBase):
    def create_api_key(self, record: ApiKeyRecord) -> None:
        row = {**{k: getattr(record, k) for k in ("id", "tenant", "name", "digest", "prefix", "created_at",
                                                   "expires_at", "revoked_at", "budget", "limits")},
               "models": list(record.models) if record.models is not None else None}
        with self._writing, self.engine.begin() as connection:
            connection.execute(_KEYS.insert(), [row])

    def api_key_by_digest(self, digest: str) -> ApiKeyRecord | None:
        with self.engine.connect() as connection:
            row = connection.execute(select(_KEYS).where(_KEYS.c.digest == digest)).first()
        return api_key_record(row._mapping) if row is not None else None

    def api_key(self, key_id: str) -> ApiKeyRecord | None:
        with self.engine.connect() as connection:
            row = connection.execute(select(_KEYS).where(_KEYS.c.id == key_id)).first()
        return api_key_record(row._mapping) if row is not None else None

    def api_keys(self, tenant: str | None = None) -> list[ApiKeyRecord]:
        query = select(_KEYS).order_by(_KEYS.c.created_at, _KEYS.c.id)
        if tenant is not None:
            query = query.where(_KEYS.c.tenant == tenant)
        with self.engine.connect() as connection:
            return [api_key_record(row._mapping) for row in connection.execute(query)]

    def revoke_api_key(self, key_id: str) -> ApiKeyRecord | None:
        """Revoke a key (once: a second revocation keeps the first time) and end the dashboard sessions
        it signed in, in one transaction; None if there is no such key."""
        with self._writing, self.engine.begin() as connection:
            connection.execute(update(_KEYS).where(_KEYS.c.id == key_id, _KEYS.c.revoked_at.is_(None))
                               .values(revoked_at=self._now()))
            connection.execute(delete(_SESSIONS).where(_SESSIONS.c.key_id == key_id))
            row = connection.execute(select(_KEYS).where(_KEYS.c.id == key_id)).first()
        return api_key_record(row._mapping) if row is not None else None

    def spend_since(self, since: datetime, tenant: str, api_key_id: str | None = None) -> float:
        """USD recorded for a tenant's runs (or one key's) started from `since` on."""
        query = select(func.coalesce(func.sum(_RUNS.c.cost_usd), 0.0)).where(
            _RUNS.c.tenant == tenant, _RUNS.c.started_at >= since)
        if api_key_id is not None:
            query = query.where(_RUNS.c.api_key_id == api_key_id)
        with self.engine.connect() as connection:
            return float(connection.execute(query).scalar_one())

    def spend_by_key(self, since: datetime, key_ids: Iterable[str]) -> dict[str, float]:
        """USD recorded per key for runs started from `since` on (keys without runs are absent)."""
        ids = list(key_ids)
        if not ids:
            return {}
        query = (select(_RUNS.c.api_key_id, func.sum(_RUNS.c.cost_usd))
                 .where(_RUNS.c.api_key_id.in_(ids), _RUNS.c.started_at >= since)
                 .group_by(_RUNS.c.api_key_id))
        with self.engine.connect() as connection:
            return {key: float(total or 0.0) for key, total in connection.execute(query)}
