"""Bearer keys: which tenant (or admin) a request speaks for."""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from gateway.config import Settings, TenantSettings, key_digest
from gateway.errors import AuthenticationFailed


@dataclass(frozen=True)
class Principal:
    """Who is calling: one tenant, or an admin who may read every tenant."""

    tenant: TenantSettings | None
    is_admin: bool
    key_id: str = ""  # a short fingerprint of the key used, never the key


    @property
    def tenant_id(self) -> str | None:
        return self.tenant.id if self.tenant else None

    def scope(self) -> str | None:
        """The tenant whose records this caller may read; None means all (admin)."""
        return None if self.is_admin else self.tenant_id


class KeyRing:
    """Keys held as sha256 digests and compared in constant time.

    Every stored digest is compared on every lookup, so the time taken does
    not tell which key (or how much of one) matched.
    """

    def __init__(self, settings: Settings) -> None:
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
        """The principal of a key by its fingerprint (for signed dashboard sessions)."""
        return next((p for _, p in self._entries if p.key_id == key_id), None)

    def lookup(self, key: str) -> Principal | None:
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        found: Principal | None = None
        for stored, principal in self._entries:
            if hmac.compare_digest(stored, digest):
                found = principal
        return found


def bearer_key(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def authenticate(keyring: KeyRing, authorization: str | None, api_key: str | None = None) -> Principal:
    """The caller of a bearer key (`Authorization: Bearer`), else of an `x-api-key` header (Anthropic's)."""
    key = bearer_key(authorization) or (api_key.strip() if api_key and api_key.strip() else None)
    if key is None:
        raise AuthenticationFailed(
            "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'.", code="missing_api_key"
        )
    principal = keyring.lookup(key)
    if principal is None:
        raise AuthenticationFailed("Incorrect API key provided.")
    return principal


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
