"""Keys made through the API: their lifecycle, their models, limits and budgets, and two replicas
on one PostgreSQL and one Redis agreeing on all of it."""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from gateway.app import create_app
from testkit.gateway import ADMIN_KEY, TENANT_KEY, RunningGateway, settings_for, within_one_rate_window
from testkit.fake_upstream import FakeUpstream, ServerThread

USER = [{"role": "user", "content": "hello"}]
PRICED = {"input_cost_per_token": 0.001, "output_cost_per_token": 0.001}
USAGE = {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}  # $0.02 at PRICED


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _start(fake: FakeUpstream, url: str, tmp_path: Path, clock: Any = time.time,
           **overrides: Any) -> tuple[RunningGateway, ServerThread]:
    settings = settings_for(fake.api_base, url, tmp_path, **overrides)
    app = create_app(settings, clock=clock)
    server = ServerThread(app).start()
    return RunningGateway(url=server.url, settings=settings, app=app, fake=fake), server


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def keyed(fake: FakeUpstream, sqlite_url: str, tmp_path: Path, clock: Clock) -> Iterator[RunningGateway]:
    running, server = _start(fake, sqlite_url, tmp_path, clock)
    yield running
    server.stop()


def _chat(gateway: RunningGateway, key: str, model: str = "fake") -> httpx.Response:
    with gateway.client(key) as http:
        return http.post("/v1/chat/completions", json={"model": model, "messages": USER})


def _create(gateway: RunningGateway, **body: Any) -> dict[str, Any]:
    with gateway.client(ADMIN_KEY) as admin:
        response = admin.post("/api/keys", json={"tenant": "acme", **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_key_is_made_used_listed_without_its_secret_and_revoked(keyed: RunningGateway) -> None:
    made = _create(keyed, name="ci runner")
    key = made["key"]
    assert key.startswith("gw-") and len(key) == 3 + 43 and made["prefix"] == key[:6]
    assert made["tenant"] == "acme" and made["revoked_at"] is None

    answered = _chat(keyed, key)
    assert answered.status_code == 200, answered.text
    with keyed.client(ADMIN_KEY) as admin:
        run = admin.get(f"/api/requests/{answered.headers['x-gateway-request-id']}").json()
        assert run["tenant"] == "acme" and run["api_key_id"] == made["id"]  # the key's id, not the key

        listed = admin.get("/api/keys")
        one = admin.get(f"/api/keys/{made['id']}")
        assert admin.get("/api/keys", params={"tenant": "globex"}).json()["data"] == []
    assert listed.status_code == 200 and one.status_code == 200
    assert key not in listed.text and key not in one.text
    assert [k["id"] for k in listed.json()["data"]] == [made["id"]]
    shown = one.json()
    assert shown["name"] == "ci runner" and shown["prefix"] == key[:6] and "key" not in shown
    assert shown["spend"]["usd_today"] == run["cost_usd"] or run["cost_usd"] is None
    assert keyed.store.api_key(made["id"]).digest != key  # only the digest is stored

    with keyed.client(ADMIN_KEY) as admin:
        revoked = admin.delete(f"/api/keys/{made['id']}")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    refused = _chat(keyed, key)
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"


def test_an_expired_key_is_refused_with_its_own_code(keyed: RunningGateway, clock: Clock) -> None:
    expires = datetime.fromtimestamp(clock.now, timezone.utc) + timedelta(minutes=5)
    made = _create(keyed, expires_at=expires.isoformat())
    assert _chat(keyed, made["key"]).status_code == 200
    clock.now += 600
    refused = _chat(keyed, made["key"])
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "expired_api_key"


def test_only_an_admin_key_manages_keys(keyed: RunningGateway) -> None:
    made = _create(keyed)
    for key in (TENANT_KEY, made["key"]):
        with keyed.client(key) as http:
            for response in (http.post("/api/keys", json={"tenant": "acme"}), http.get("/api/keys"),
                             http.get(f"/api/keys/{made['id']}"), http.delete(f"/api/keys/{made['id']}")):
                assert response.status_code == 403, response.text
                assert response.json()["error"]["type"] == "permission_error"
    with httpx.Client(base_url=keyed.url) as anonymous:
        assert anonymous.get("/api/keys").status_code == 401
    assert _chat(keyed, made["key"]).status_code == 200  # the tenant's attempt revoked nothing


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"tenant": "nope"}, "tenant", "'nope'"),
    ({"name": "x"}, "tenant", "required"),
    ({"tenant": "acme", "colour": "red"}, "colour", "Extra inputs"),
    ({"tenant": "acme", "budget": {"usd_per_day": -1}}, "budget.usd_per_day", "greater than 0"),
    ({"tenant": "acme", "limits": {"requests_per_minute": "many"}}, "limits.requests_per_minute", "integer"),
    ({"tenant": "acme", "models": ["gpt-7"]}, "models", "'gpt-7'"),
    ({"tenant": "acme", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at", "past"),
    ({"tenant": "acme", "expires_at": "tomorrow"}, "expires_at", "datetime"),
    ({"tenant": "acme", "name": "a\u0000b"}, "name", "NUL"),
])
def test_a_bad_body_is_a_400_naming_the_field(keyed: RunningGateway, body: dict, param: str, words: str) -> None:
    with keyed.client(ADMIN_KEY) as admin:
        response = admin.post("/api/keys", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and words in error["message"]


def test_bad_json_and_unknown_ids(keyed: RunningGateway) -> None:
    with keyed.client(ADMIN_KEY) as admin:
        broken = admin.post("/api/keys", content=b"{not json", headers={"content-type": "application/json"})
        assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
        for response in (admin.get("/api/keys/key_nothing"), admin.delete("/api/keys/key_nothing")):
            assert response.status_code == 404 and response.json()["error"]["code"] == "api_key_not_found"
    assert keyed.store.api_keys() == []


def test_a_key_limited_to_models(keyed: RunningGateway) -> None:
    made = _create(keyed, models=["fake"])
    assert _chat(keyed, made["key"], "fake").status_code == 200
    refused = _chat(keyed, made["key"], "demo")
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    with keyed.client(made["key"]) as http:
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["fake"]
    assert _chat(keyed, TENANT_KEY, "demo").status_code == 200  # the tenant's own key is not limited


def test_a_key_has_its_own_request_rate(keyed: RunningGateway) -> None:
    made = _create(keyed, limits={"requests_per_minute": 1})
    within_one_rate_window()
    assert _chat(keyed, made["key"]).status_code == 200
    refused = _chat(keyed, made["key"])
    assert refused.status_code == 429
    assert f"API key '{made['id']}'" in refused.json()["error"]["message"]
    assert _chat(keyed, TENANT_KEY).status_code == 200  # the tenant has no limit of its own


def _priced_models(fake: FakeUpstream) -> list[dict]:
    return [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": fake.api_base,
                                                 "api_key": "sk-upstream", **PRICED}}]


def test_tenant_budget_from_the_config_blocks_once_spent(fake: FakeUpstream, sqlite_url: str,
                                                         tmp_path: Path) -> None:
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "budget": {"usd_per_day": 0.03}}]
    gateway, server = _start(fake, sqlite_url, tmp_path, models=_priced_models(fake), tenants=tenants)
    try:
        made = _create(gateway)
        for key in (TENANT_KEY, made["key"]):  # $0.02 each: the second crosses $0.03
            fake.script(usage=USAGE)
            answered = _chat(gateway, key)
            assert answered.status_code == 200, answered.text
            with gateway.client(ADMIN_KEY) as admin:  # waits for the outcome (and its cost) to be written
                assert admin.get(f"/api/requests/{answered.headers['x-gateway-request-id']}").json()["cost_usd"] \
                    == pytest.approx(0.02)
        refused = _chat(gateway, TENANT_KEY)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
        error = refused.json()["error"]
        assert error["code"] == "budget_exceeded" and error["type"] == "insufficient_quota"
        assert "tenant 'acme'" in error["message"] and "per day" in error["message"]
        assert "resets at" in error["message"]
        with gateway.client(ADMIN_KEY) as admin:
            assert admin.get(f"/api/keys/{made['id']}").json()["spend"]["usd_today"] == pytest.approx(0.02)
    finally:
        server.stop()


def test_two_replicas_share_keys_revocations_and_budgets(fake: FakeUpstream, postgres_url: str, tmp_path: Path,
                                                         redis_url: str, redis_prefix: str) -> None:
    redis = {"url": redis_url, "key_prefix": redis_prefix}
    one, server_one = _start(fake, postgres_url, tmp_path, models=_priced_models(fake), redis=redis)
    two, server_two = _start(fake, postgres_url, tmp_path, models=_priced_models(fake), redis=redis)
    try:
        # Made on one, works on the other at once (it has already refused a few unknown keys).
        assert _chat(two, "gw-not-a-key").status_code == 401
        made = _create(one, budget={"usd_per_day": 0.03})
        fake.script(usage=USAGE)
        first = _chat(two, made["key"])
        assert first.status_code == 200, first.text

        # A budget crossed on one blocks on the other: both have read the key's counter already, so
        # only a shared counter can tell two what one spent.
        with two.client(ADMIN_KEY) as admin:
            admin.get(f"/api/requests/{first.headers['x-gateway-request-id']}")  # its cost is counted
        fake.script(usage=USAGE)
        second = _chat(one, made["key"])
        assert second.status_code == 200, second.text
        with one.client(ADMIN_KEY) as admin:
            admin.get(f"/api/requests/{second.headers['x-gateway-request-id']}")
        refused = _chat(two, made["key"])
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "budget_exceeded"
        assert f"API key '{made['id']}'" in refused.json()["error"]["message"]

        # Revoked on one: refused by the other within a second (it had the key cached as good).
        other = _create(one)
        assert _chat(two, other["key"]).status_code == 200
        with one.client(ADMIN_KEY) as admin:
            assert admin.delete(f"/api/keys/{other['id']}").status_code == 200
        assert _chat(one, other["key"]).status_code == 401
        deadline = time.monotonic() + 1.0
        status = _chat(two, other["key"]).status_code
        while status != 401 and time.monotonic() < deadline:
            time.sleep(0.05)
            status = _chat(two, other["key"]).status_code
        assert status == 401
    finally:
        server_one.stop()
        server_two.stop()
