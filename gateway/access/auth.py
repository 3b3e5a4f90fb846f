"""Bearer keys: which tenant (or admin) a request speaks for."""
from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Mapping

from gateway.access.key_cache import DatabaseKeys
from gateway.config import BudgetSettings, LimitSettings, Settings, TenantSettings, key_digest
from gateway.errors import AuthenticationFailed
from gateway.ops.logs import note_tenant
from gateway.threads import off_loop
from storage.api_keys import ApiKeyRecord

API_KEY_PREFIX = "gw-"  # keys made through the API; only these are looked up in the database


@dataclass(frozen=True)
class Principal:
    """Who is calling: one tenant, or an admin who may read every tenant."""

    tenant: TenantSettings | None
    is_admin: bool
    key_id: str = ""  # a short fingerprint of the key used (a made key's id), never the key
    api_key: ApiKeyRecord | None = None  # a key made through the API: its own budget and limits

    @property
    def key_limits(self) -> LimitSettings | None:
        return LimitSettings(**self.api_key.limits) if self.api_key and self.api_key.limits else None

    @property
    def key_budget(self) -> BudgetSettings | None:
        return BudgetSettings(**self.api_key.budget) if self.api_key and self.api_key.budget else None

    @property
    def tenant_id(self) -> str | None:
        return self.tenant.id if self.tenant else None

    def scope(self) -> str | None:
        """The tenant whose records this caller may read; None means all (admin)."""
        return None if self.is_admin else self.tenant_id


class KeyRing:
    """The config's keys held as sha256 digests and compared in constant time, then (`find`) the
    keys made through the API, from the database by digest through `DatabaseKeys`.

    Every config digest is compared on every lookup, so the time taken does
    not tell which key (or how much of one) matched.
    """

    def __init__(self, settings: Settings, database: DatabaseKeys | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.database = database
        self.clock = clock
        self._entries: list[tuple[bytes, Principal]] = []
        for tenant in settings.tenants:
            for key in tenant.api_keys:
                digest = key_digest(key)
                principal = Principal(tenant=tenant, is_admin=False, key_id=f"key-{digest[:12]}")
                self._entries.append((bytes.fromhex(digest), principal))
        for key in settings.admin_keys:
            digest = key_digest(key)
            principal = Principal(tenant=None, is_admin=True, key_id=f"key-{digest[:12]}")
            self._entries.append((bytes.fromhex(digest), principal))

    def by_key_id(self, key_id: str) -> Principal | None:
        """The principal of a config key by its fingerprint."""
        return next((p for _, p in self._entries if p.key_id == key_id), None)

    def key_ids(self) -> frozenset[str]:
        """The fingerprints of the config's keys (a reload ends the dashboard sessions of those it drops)."""
        return frozenset(p.key_id for _, p in self._entries)

    def session_principal(self, key_id: str, record: ApiKeyRecord | None) -> Principal | None:
        """Whom a dashboard session signed in by `key_id` speaks for now: a config key by its
        fingerprint, a made key from its record as just read; None once the key is gone, revoked or
        expired."""
        if record is None:
            return self.by_key_id(key_id)
        try:
            return self._made(record)
        except AuthenticationFailed:
            return None

    def lookup(self, key: str) -> Principal | None:
        """A key of the config."""
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        found: Principal | None = None
        for stored, principal in self._entries:
            if hmac.compare_digest(stored, digest):
                found = principal
        return found

    def find(self, key: str) -> Principal | None:
        """A key of the config, else one made through the API (may read the database: blocking)."""
        found = self.lookup(key)
        if found is not None or self.database is None or not key.startswith(API_KEY_PREFIX):
            return found
        digest = key_digest(key)
        known, record = self.database.cached(digest)
        return self._made(record if known else self.database.load(digest))

    async def afind(self, key: str) -> Principal | None:
        """`find` for the event loop: the database is read in a worker thread, and only on a cache miss."""
        found = self.lookup(key)
        if found is not None or self.database is None or not key.startswith(API_KEY_PREFIX):
            return found
        digest = key_digest(key)
        known, record = self.database.cached(digest)
        return self._made(record if known else await off_loop(self.database.load, digest))

    def _made(self, record: ApiKeyRecord | None) -> Principal | None:
        """The principal of a made key under the running config; 401 if revoked or expired."""
        if record is None:
            return None
        note_tenant(record.tenant)  # a revoked or expired key still says whose it was, in the log
        if record.revoked_at is not None:
            raise AuthenticationFailed("This API key was revoked.", code="revoked_api_key")
        if record.expires_at is not None and record.expires_at <= datetime.fromtimestamp(self.clock(), timezone.utc):
            raise AuthenticationFailed(f"This API key expired at {record.expires_at.isoformat()}.",
                                       code="expired_api_key")
        tenant = next((t for t in self.settings.tenants if t.id == record.tenant), None)
        if tenant is None:  # the tenant left the config: its keys go with it
            return None
        if record.models is not None:
            allowed = [m for m in record.models if tenant.models is None or m in tenant.models]
            tenant = tenant.model_copy(update={"models": allowed})
        return Principal(tenant=tenant, is_admin=False, key_id=record.id, api_key=record)


def bearer_key(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def api_key_beside_bearer(headers: Mapping[str, str], path: str, query: Mapping[str, str]) -> str | None:
    """The key a client sends other than as a bearer token: `x-api-key` (Anthropic's clients),
    `x-goog-api-key` or, on Google's routes only, `?key=` (Google's). The access log and spans carry the
    path without the query, so a key there is not written down."""
    key = headers.get("x-api-key") or headers.get("x-goog-api-key")
    if key is None and (path.startswith("/v1beta/") or (path.startswith("/v1/models/") and ":" in path)):
        key = query.get("key")
    return key


def _presented(authorization: str | None, api_key: str | None) -> str:
    key = bearer_key(authorization) or (api_key.strip() if api_key and api_key.strip() else None)
    if key is None:
        raise AuthenticationFailed(
            "Missing API key: send 'Authorization: Bearer <key>', 'x-api-key: <key>' or (Gemini's) "
            "'x-goog-api-key: <key>'.", code="missing_api_key"
        )
    return key


def _known(principal: Principal | None) -> Principal:
    if principal is None:
        raise AuthenticationFailed("Incorrect API key provided.")
    note_tenant(principal.tenant_id)  # every line logged for the request from here on names it
    return principal


def authenticate(keyring: KeyRing, authorization: str | None, api_key: str | None = None) -> Principal:
    """The caller of a bearer key (`Authorization: Bearer`), else of an `x-api-key` header (Anthropic's).
    Blocking on a made key's cache miss: for code in a worker thread (sync dependencies)."""
    return _known(keyring.find(_presented(authorization, api_key)))


async def authenticate_async(keyring: KeyRing, authorization: str | None, api_key: str | None = None) -> Principal:
    """`authenticate` on the event loop."""
    return _known(await keyring.afind(_presented(authorization, api_key)))


def metrics_caller(keyring: KeyRing, token: str, authorization: str | None) -> None:
    """`/metrics` behind a bearer token (or an admin key); AuthenticationFailed otherwise."""
    key = bearer_key(authorization)
    if key is None:
        raise AuthenticationFailed("/metrics needs 'Authorization: Bearer <metrics token>'.", code="missing_api_key")
    expected = bytes.fromhex(key_digest(token))
    given = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    if hmac.compare_digest(expected, given):
        return
    principal = keyring.lookup(key)
    if principal is None or not principal.is_admin:
        raise AuthenticationFailed("Incorrect metrics token.")
