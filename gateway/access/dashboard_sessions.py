"""Dashboard sign-in: a signed cookie naming a session that the database holds.

The cookie never holds the key: a random session id, the fingerprint of the
key that signed in, an expiry and an HMAC over them. It is HttpOnly and
SameSite=Strict. The signature lets a replica refuse a forged or expired
cookie without a query; the row in `dashboard_sessions` (storage/dashboard_sessions.py)
is what keeps it alive: each page reads it, so signing out, revoking the key
(`DELETE /api/keys/{id}`) or removing it from the config ends the session on
every replica at its next page, not when the cookie expires. The key is then
resolved again under the running config, so a key gone, revoked or expired
signs nobody in.

With several replicas, set `dashboard.session_secret` (e.g.
`os.environ/GATEWAY_SESSION_SECRET`) so each replica accepts the others'
cookies; without it a random secret per process is used and sign-ins last
until a restart.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone

from gateway.access.auth import KeyRing, Principal
from gateway.ops.logs import note_tenant
from storage.records import RecordStore

COOKIE = "gw_session"
LIFETIME_SECONDS = 12 * 3600


@dataclass(frozen=True)
class SessionClaim:
    """What a cookie with a good signature says (it may still have been ended on the server)."""

    session_id: str
    key_id: str
    expires: int


class SessionSigner:
    def __init__(self, secret: str | None) -> None:
        self._secret = (secret or secrets.token_hex(32)).encode()

    def mac(self, purpose: str, value: str) -> str:
        """An HMAC of `value` for one purpose (a cookie's signature, a form's token)."""
        return hmac.new(self._secret, f"{purpose}\x00{value}".encode(), hashlib.sha256).hexdigest()

    def issue(self, claim: SessionClaim) -> str:
        payload = base64.urlsafe_b64encode(json.dumps(
            {"s": claim.session_id, "k": claim.key_id, "exp": claim.expires}).encode()).decode()
        return f"{payload}.{self.mac('session', payload)}"

    def read(self, cookie: str | None, now: float) -> SessionClaim | None:
        """The claim of a cookie this gateway signed and that has not expired; None otherwise."""
        if not cookie or "." not in cookie:
            return None
        payload, mac = cookie.rsplit(".", 1)
        if not hmac.compare_digest(mac, self.mac("session", payload)):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(payload.encode()))
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("s"), str) or not isinstance(data.get("k"), str):
            return None  # a cookie of the earlier format (no session id) signs nobody in
        expires = data.get("exp")
        if not isinstance(expires, int) or expires <= now:
            return None
        return SessionClaim(session_id=data["s"], key_id=data["k"], expires=expires)


def start_session(store: RecordStore, signer: SessionSigner, principal: Principal, now: float) -> str:
    """Record a new session for `principal` and return its cookie (blocking: a database write)."""
    claim = SessionClaim(session_id=secrets.token_urlsafe(32), key_id=principal.key_id,
                         expires=int(now + LIFETIME_SECONDS))
    store.start_dashboard_session(claim.session_id, claim.key_id, principal.tenant_id,
                                  datetime.fromtimestamp(claim.expires, timezone.utc))
    return signer.issue(claim)


def signed_in(store: RecordStore, signer: SessionSigner, keyring: KeyRing, cookie: str | None,
              now: float) -> Principal | None:
    """Who the cookie's live session speaks for now (blocking: one database read); None if nobody."""
    claim = signer.read(cookie, now)
    if claim is None:
        return None
    record = store.dashboard_session(claim.session_id)
    if record is None or record.key_id != claim.key_id:
        return None
    principal = keyring.session_principal(record.key_id, record.api_key)
    note_tenant(principal.tenant_id if principal else None)
    return principal


def end_session(store: RecordStore, signer: SessionSigner, cookie: str | None, now: float) -> None:
    """Sign-out: the cookie's session is deleted, so a copy of the cookie signs nobody in either."""
    claim = signer.read(cookie, now)
    if claim is not None:
        store.end_dashboard_session(claim.session_id)
