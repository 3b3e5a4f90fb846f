"""Dashboard sign-in: a signed, expiring session cookie that names a key by its fingerprint.

The cookie never holds the key: only its fingerprint, an expiry and an HMAC
over both. It is HttpOnly and SameSite=Strict. With several replicas, set
`dashboard.session_secret` (e.g. `os.environ/GATEWAY_SESSION_SECRET`) so each
replica accepts the others' cookies; without it a random secret per process
is used and sign-ins last until a restart.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time

from gateway.auth import KeyRing, Principal

COOKIE = "gw_session"
LIFETIME_SECONDS = 12 * 3600


class SessionSigner:
    def __init__(self, secret: str | None) -> None:
        self._secret = (secret or secrets.token_hex(32)).encode()

    def _mac(self, payload: bytes) -> str:
        return hmac.new(self._secret, payload, hashlib.sha256).hexdigest()

    def issue(self, principal: Principal, now: float | None = None) -> str:
        expires = int((now or time.time()) + LIFETIME_SECONDS)
        payload = base64.urlsafe_b64encode(json.dumps({"k": principal.key_id, "exp": expires}).encode())
        return f"{payload.decode()}.{self._mac(payload)}"

    def verify(self, cookie: str | None, keyring: KeyRing, now: float | None = None) -> Principal | None:
        if not cookie or "." not in cookie:
            return None
        payload, mac = cookie.rsplit(".", 1)
        if not hmac.compare_digest(mac, self._mac(payload.encode())):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(payload.encode()))
        except ValueError:
            return None
        if not isinstance(data, dict) or int(data.get("exp", 0)) < (now or time.time()):
            return None
        return keyring.by_key_id(str(data.get("k")))
