"""Per-tenant rate limits: in memory for one process, in Redis (the real server) for replicas."""
from __future__ import annotations

from pathlib import Path

import pytest

from storage.ratelimit import MemoryRateLimiter, RedisRateLimiter
from testkit.gateway import OTHER_TENANT_KEY, TENANT_KEY, settings_for, start_gateway, within_one_rate_window
from testkit.fake_upstream import FakeUpstream

USER = [{"role": "user", "content": "hello"}]


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_010.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_fixed_window_counts_and_resets(backend: str, request: pytest.FixtureRequest) -> None:
    clock = Clock()
    if backend == "redis":
        limiter = RedisRateLimiter(request.getfixturevalue("redis_url"),
                                   prefix=request.getfixturevalue("redis_prefix"), clock=clock)
    else:
        limiter = MemoryRateLimiter(clock)
    first = await limiter.hit("acme:requests", 1, 2)
    second = await limiter.hit("acme:requests", 1, 2)
    third = await limiter.hit("acme:requests", 1, 2)
    other = await limiter.hit("globex:requests", 1, 2)
    assert (first.allowed, second.allowed, third.allowed, other.allowed) == (True, True, False, True)
    assert (first.remaining, second.remaining, third.remaining) == (1, 0, 0)
    assert third.reset_seconds == 50  # the window started 10 s ago
    clock.now += 60
    assert (await limiter.hit("acme:requests", 1, 2)).allowed
    await limiter.close()


def _limited_gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path, redis: dict | None):
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "limits": {"requests_per_minute": 2}},
               {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "limits": {"tokens_per_minute": 30}}]
    extra = {"redis": redis} if redis else {}
    return start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, tenants=tenants, **extra), fake)


def test_two_replicas_share_one_limit_through_redis(fake: FakeUpstream, sqlite_url: str, tmp_path: Path,
                                                    redis_url: str, redis_prefix: str) -> None:
    redis = {"url": redis_url, "key_prefix": redis_prefix}
    one, server_one = _limited_gateway(fake, sqlite_url, tmp_path, redis)
    two, server_two = _limited_gateway(fake, sqlite_url, tmp_path, redis)
    try:
        within_one_rate_window()
        with one.client() as a, two.client() as b:
            assert a.post("/v1/chat/completions", json={"model": "fake", "messages": USER}).status_code == 200
            ok = b.post("/v1/chat/completions", json={"model": "fake", "messages": USER})
            assert ok.status_code == 200 and ok.headers["x-ratelimit-remaining-requests"] == "0"
            refused = a.post("/v1/chat/completions", json={"model": "fake", "messages": USER})
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
            assert refused.json()["error"]["type"] == "rate_limit_error"
            assert 0 < int(refused.headers["retry-after"]) <= 60
            assert a.get("/readyz").json() == {"status": "ready"}
        assert len(fake.requests) == 2  # the refused request never reached the provider
    finally:
        server_one.stop()
        server_two.stop()


def test_tokens_per_minute_counts_forwarded_tokens(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> None:
    running, server = _limited_gateway(fake, sqlite_url, tmp_path, None)
    try:
        within_one_rate_window()
        with running.client(key=OTHER_TENANT_KEY) as http:
            small = http.post("/v1/chat/completions", json={"model": "fake", "messages": USER})
            assert small.status_code == 200 and small.headers["x-ratelimit-limit-tokens"] == "30"
            big = http.post("/v1/chat/completions",
                            json={"model": "fake", "messages": [{"role": "user", "content": "word " * 100}]})
            assert big.status_code == 429 and "tokens per minute" in big.json()["error"]["message"]
            record = http.get(f"/api/requests/{big.headers['x-gateway-request-id']}").json()
            assert record["status"] == "error" and record["error"]["type"] == "rate_limit_exceeded"
    finally:
        server.stop()
