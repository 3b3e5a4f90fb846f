"""Dashboard sessions end on the server (gateway/access/dashboard_sessions.py): the cookie's signature, then the row
every replica reads. Signing out, revoking a made key and removing a config key on reload each end a
signed-in browser's session at its next page; two replicas on one PostgreSQL agree at once."""
from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.access.auth import KeyRing, Principal
from gateway.access.dashboard_sessions import SessionClaim, SessionSigner
from gateway.app import create_app
from gateway.config import load_settings
from storage.api_keys import ApiKeyRecord
from testkit.gateway import (
    ADMIN_KEY,
    TENANT_KEY,
    RunningGateway,
    dashboard_form_token,
    dashboard_sign_in,
    settings_for,
    start_gateway,
)
from testkit.fake_upstream import FakeUpstream, ServerThread

SIGNER = SessionSigner("secret")
NOW = 1_800_000_000.0


def test_a_cookie_is_read_only_with_its_signature_and_before_its_expiry() -> None:
    claim = SessionClaim(session_id="sid", key_id="key-0123456789ab", expires=int(NOW) + 60)
    cookie = SIGNER.issue(claim)
    assert SIGNER.read(cookie, NOW) == claim
    assert SIGNER.read(cookie, NOW + 60) is None  # expired
    assert SessionSigner("another secret").read(cookie, NOW) is None
    payload, mac = cookie.rsplit(".", 1)
    forged = base64.urlsafe_b64encode(json.dumps({"s": "sid", "k": "key-admin", "exp": int(NOW) + 60}).encode())
    assert SIGNER.read(f"{forged.decode()}.{mac}", NOW) is None
    for broken in (None, "", "no-dot", f"{payload}.", "!!!." + SIGNER.mac("session", "!!!")):
        assert SIGNER.read(broken, NOW) is None


def test_a_cookie_of_the_earlier_format_signs_nobody_in() -> None:
    """Before sessions were recorded, a cookie held only the key and the expiry."""
    payload = base64.urlsafe_b64encode(json.dumps({"k": "key-0123456789ab", "exp": int(NOW) + 60}).encode()).decode()
    assert SIGNER.read(f"{payload}.{SIGNER.mac('session', payload)}", NOW) is None


def _browser(gateway: RunningGateway, key: str) -> httpx.Client:
    client = httpx.Client(base_url=gateway.url, timeout=30)
    assert dashboard_sign_in(client, key).status_code == 303
    return client


def _page(client: httpx.Client) -> int:
    """What the overview answers this browser: 200 signed in, 303 to the sign-in page otherwise."""
    response = client.get("/dashboard")
    assert response.status_code == 200 or response.headers["location"] == "/dashboard/login"
    return response.status_code


def test_a_made_key_signs_in_and_its_revocation_ends_the_session(fake: FakeUpstream, sqlite_url: str,
                                                                  tmp_path: Path) -> None:
    gateway, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path), fake)
    try:
        with gateway.client(ADMIN_KEY) as admin:
            made = admin.post("/api/keys", json={"tenant": "acme", "models": ["demo"]}).json()
            other = admin.post("/api/keys", json={"tenant": "acme"}).json()
        browser, bystander = _browser(gateway, made["key"]), _browser(gateway, other["key"])
        page = browser.get("/dashboard")
        assert page.status_code == 200 and "tenant acme" in page.text
        assert browser.get("/api/savings").status_code == 200  # the cookie reads the API too
        with gateway.client(ADMIN_KEY) as admin:
            assert admin.delete(f"/api/keys/{made['id']}").status_code == 200
        assert _page(browser) == 303 and browser.get("/api/savings").status_code == 401
        assert _page(bystander) == 200  # another key's session goes on
        again = browser.post("/dashboard/login", data={"api_key": made["key"],
                                                       "csrf_token": dashboard_form_token(browser)})
        assert again.status_code == 401 and "revoked" in again.text
    finally:
        server.stop()


def _config(folder: Path, api_base: str, storage_url: str, keys: list[str]) -> Path:
    config = {
        "models": [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": api_base,
                                                        "api_key": "sk-upstream"}}],
        "tenants": [{"id": "acme", "api_keys": keys}],
        "admin_keys": [ADMIN_KEY],
        "storage": {"url": storage_url, "blob_dir": str(folder / "blobs")},
    }
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _reload(gateway: RunningGateway) -> None:
    with gateway.client(ADMIN_KEY) as admin:
        assert admin.post("/api/admin/reload").json()["ok"] is True


def test_a_config_key_removed_on_reload_ends_its_sessions_for_good(fake: FakeUpstream, sqlite_url: str,
                                                                   tmp_path: Path) -> None:
    path = _config(tmp_path, fake.api_base, sqlite_url, [TENANT_KEY, "sk-acme-2"])
    gateway, server = start_gateway(load_settings(path), fake)
    try:
        removed, kept = _browser(gateway, TENANT_KEY), _browser(gateway, "sk-acme-2")
        _config(tmp_path, fake.api_base, sqlite_url, ["sk-acme-2"])
        _reload(gateway)
        assert (_page(removed), _page(kept)) == (303, 200)
        _config(tmp_path, fake.api_base, sqlite_url, [TENANT_KEY, "sk-acme-2"])
        _reload(gateway)  # the key is back: it signs in again, but the session it had stays ended
        assert _page(removed) == 303 and _page(_browser(gateway, TENANT_KEY)) == 200
    finally:
        server.stop()


def _replica(fake: FakeUpstream, url: str, tmp_path: Path) -> tuple[RunningGateway, ServerThread]:
    settings = settings_for(fake.api_base, url, tmp_path, dashboard={"session_secret": "shared-by-replicas"})
    app = create_app(settings)
    server = ServerThread(app).start()
    return RunningGateway(url=server.url, settings=settings, app=app, fake=fake), server


def _on(gateway: RunningGateway, client: httpx.Client) -> httpx.Client:
    """The same browser (its cookies) talking to another replica."""
    return httpx.Client(base_url=gateway.url, timeout=30, cookies=client.cookies)


def test_replicas_agree_at_once_on_sign_out_and_revocation(fake: FakeUpstream, postgres_url: str,
                                                           tmp_path: Path) -> None:
    one, server_one = _replica(fake, postgres_url, tmp_path)
    two, server_two = _replica(fake, postgres_url, tmp_path)
    try:
        browser = _browser(one, TENANT_KEY)
        with _on(two, browser) as elsewhere:
            assert _page(elsewhere) == 200  # signed in on one, served by two
            token = dashboard_form_token(elsewhere, "/dashboard")
            assert elsewhere.post("/dashboard/logout", data={"csrf_token": token}).status_code == 303
        assert _page(browser) == 303  # signed out on two, refused by one at its next page

        with one.client(ADMIN_KEY) as admin:
            made: dict[str, Any] = admin.post("/api/keys", json={"tenant": "acme"}).json()
        browser = _browser(two, made["key"])
        with _on(one, browser) as elsewhere:
            assert _page(elsewhere) == 200
            with one.client(ADMIN_KEY) as admin:
                assert admin.delete(f"/api/keys/{made['id']}").status_code == 200
            assert _page(elsewhere) == 303 and _page(browser) == 303  # both replicas, no waiting
    finally:
        server_one.stop()
        server_two.stop()


def test_a_principal_is_resolved_again_for_each_page() -> None:
    """The keyring decides who a session's key speaks for now (a made key: from its record as read)."""
    settings = settings_for("http://127.0.0.1:9", "sqlite:////tmp/unused.db", Path("/tmp"))  # parsed only
    keyring = KeyRing(settings, clock=lambda: NOW)
    config_key = next(iter(keyring.key_ids()))
    assert isinstance(keyring.session_principal(config_key, None), Principal)
    assert keyring.session_principal("key-000000000000", None) is None  # a config key no longer there
    when = datetime.fromtimestamp(NOW, timezone.utc)
    record = ApiKeyRecord(id="key_abc", tenant="acme", name=None, digest="d" * 64, prefix="gw-abc",
                          created_at=when, expires_at=None, revoked_at=None, models=("demo",), budget={}, limits={})
    principal = keyring.session_principal("key_abc", record)
    assert principal is not None and principal.tenant_id == "acme" and principal.tenant.models == ["demo"]
    assert keyring.session_principal("key_abc", replace(record, revoked_at=when)) is None
    assert keyring.session_principal("key_abc", replace(record, expires_at=when - timedelta(seconds=1))) is None
    assert keyring.session_principal("key_abc", replace(record, tenant="gone")) is None  # its tenant left the config

