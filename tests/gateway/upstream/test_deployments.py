"""Deployments: several config entries under one model name, retried, fallen back and cooled down
(gateway/upstream/deployments.py), against fake upstreams that fail in scripted ways."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from gateway.config import ConfigError
from gateway.upstream.deployment_params import accepted_names, refusal
from testkit.gateway import TENANT_KEY, RunningGateway, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream

USER = [{"role": "user", "content": "hello"}]
AUTH = {"Authorization": f"Bearer {TENANT_KEY}"}


@pytest.fixture(scope="module")
def second_upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as server:
        yield server


@pytest.fixture
def other(second_upstream: FakeUpstream) -> FakeUpstream:
    second_upstream.reset()
    return second_upstream


def _deployment(name: str, fake: FakeUpstream, model: str, **params: Any) -> dict[str, Any]:
    return {"name": name, "litellm_params": {"model": f"openai/{model}", "api_base": fake.api_base,
                                             "api_key": "sk-upstream", **params}}


@pytest.fixture
def routed(fake: FakeUpstream, other: FakeUpstream, sqlite_url: str, tmp_path: Path,
           request: pytest.FixtureRequest) -> Iterator[RunningGateway]:
    """`routed` on two deployments (A on `fake`, tried first by `order`, B on `other`), `primary` on A
    alone with `backup` (on B) as its fallback; the router's settings from the test's marker."""
    marker = request.node.get_closest_marker("router")
    router = {"num_retries": 2, **(marker.kwargs if marker else {})}
    a_params = router.pop("a_params", {})
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, models=[
        _deployment("routed", fake, "model-a", order=1, **a_params),
        _deployment("routed", other, "model-b", order=2),
        _deployment("primary", fake, "model-a"),
        _deployment("backup", other, "model-b"),
    ], router={"fallbacks": [{"primary": ["backup"]}], **router})
    running, server = start_gateway(settings, fake)
    yield running
    server.stop()


def _run(gateway: RunningGateway, response: httpx.Response) -> dict[str, Any]:
    with gateway.client(key=_admin()) as client:
        found = client.get(f"/api/requests/{response.headers['x-gateway-request-id']}")
    assert found.status_code == 200, found.text
    return found.json()


def _admin() -> str:
    from testkit.gateway import ADMIN_KEY

    return ADMIN_KEY


def _error(status: int, retry_after: str | None = "0") -> dict[str, Any]:
    return {"status": status, "headers": {"retry-after": retry_after} if retry_after is not None else {}}


def test_a_429_is_retried_on_the_other_deployment(routed: RunningGateway, fake: FakeUpstream,
                                                   other: FakeUpstream) -> None:
    fake.script(**_error(429))
    other.script_message({"content": "from B"})
    response = httpx.post(f"{routed.api_base}/chat/completions", headers=AUTH,
                          json={"model": "routed", "messages": USER})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "from B"
    assert len(fake.requests) == 1 and len(other.requests) == 1
    assert other.last_body()["model"] == "model-b"
    run = _run(routed, response)
    assert run["status"] == "ok"
    assert run["deployment"] == "routed#2" and run["upstream_model"] == "openai/model-b"
    assert [(a["deployment"], a["outcome"], a["http_status"]) for a in run["attempts"]] == [
        ("routed#1", "rate_limit_exceeded", 429), ("routed#2", "ok", 200)]


def test_a_fallback_model_answers_once_the_retries_are_spent(routed: RunningGateway, fake: FakeUpstream,
                                                             other: FakeUpstream) -> None:
    for _ in range(3):
        fake.script(**_error(500))
    other.script_message({"content": "from backup"})
    response = httpx.post(f"{routed.api_base}/chat/completions", headers=AUTH,
                          json={"model": "primary", "messages": USER})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "from backup"
    assert len(fake.requests) == 3  # the first try and num_retries (2) more
    run = _run(routed, response)
    assert run["model"] == "primary" and run["deployment"] == "backup#1"
    assert [(a["model"], a["outcome"]) for a in run["attempts"]] == [
        ("primary", "upstream_error"), ("primary", "upstream_error"), ("primary", "upstream_error"),
        ("backup", "ok")]


@pytest.mark.router(num_retries=0)
def test_without_retries_or_fallback_the_error_reaches_the_client(routed: RunningGateway, fake: FakeUpstream,
                                                                  other: FakeUpstream) -> None:
    fake.script(**_error(503))
    response = httpx.post(f"{routed.api_base}/chat/completions", headers=AUTH,
                          json={"model": "routed", "messages": USER})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "upstream_error"
    assert other.requests == []
    run = _run(routed, response)
    assert run["status"] == "error" and run["deployment"] == "routed#1"


def test_a_request_the_provider_refuses_is_not_retried(routed: RunningGateway, fake: FakeUpstream,
                                                       other: FakeUpstream) -> None:
    fake.script(status=400, error={"message": "bad temperature", "type": "invalid_request_error",
                                   "param": "temperature", "code": None})
    response = httpx.post(f"{routed.api_base}/chat/completions", headers=AUTH,
                          json={"model": "routed", "messages": USER})
    assert response.status_code == 400
    assert len(fake.requests) == 1 and other.requests == []


@pytest.mark.router(allowed_fails=0, cooldown_time=1.5)
def test_a_failed_deployment_cools_down_then_serves_again(routed: RunningGateway, fake: FakeUpstream,
                                                          other: FakeUpstream) -> None:
    fake.script(**_error(500))
    first = httpx.post(f"{routed.api_base}/chat/completions", headers=AUTH,
                       json={"model": "routed", "messages": USER})
    assert first.status_code == 200 and len(fake.requests) == 1 and len(other.requests) == 1
    # A is cooling down: B serves although A comes first by `order`.
    for _ in range(3):
        again = httpx.post(f"{routed.api_base}/chat/completions", headers=AUTH,
                           json={"model": "routed", "messages": USER})
        assert again.status_code == 200
        assert _run(routed, again)["deployment"] == "routed#2"
    assert len(fake.requests) == 1 and len(other.requests) == 4
    time.sleep(1.8)
    back = httpx.post(f"{routed.api_base}/chat/completions", headers=AUTH,
                      json={"model": "routed", "messages": USER})
    assert back.status_code == 200 and _run(routed, back)["deployment"] == "routed#1"
    assert len(fake.requests) == 2


def _events(response: httpx.Response) -> list[Any]:
    out = []
    for line in response.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[len("data: "):]))
    return out


def test_a_stream_failing_before_its_first_byte_is_retried(routed: RunningGateway, fake: FakeUpstream,
                                                            other: FakeUpstream) -> None:
    fake.script(**_error(503))
    other.script_message({"content": "streamed from B"})
    response = httpx.post(f"{routed.api_base}/chat/completions", headers=AUTH,
                          json={"model": "routed", "messages": USER, "stream": True})
    assert response.status_code == 200
    events = _events(response)
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in events if c.get("choices"))
    assert text == "streamed from B"
    assert not any("error" in e for e in events)
    assert [a["outcome"] for a in _run(routed, response)["attempts"]] == ["upstream_error", "ok"]


def test_a_stream_failing_after_its_first_byte_is_reported_not_retried(
        routed: RunningGateway, fake: FakeUpstream, other: FakeUpstream) -> None:
    fake.script_message({"content": "a long answer that breaks"}, break_stream_after=2)
    response = httpx.post(f"{routed.api_base}/chat/completions", headers=AUTH,
                          json={"model": "routed", "messages": USER, "stream": True})
    assert response.status_code == 200
    events = _events(response)
    assert "error" in events[-1]
    assert other.requests == []
    run = _run(routed, response)
    assert run["status"] == "error" and run["deployment"] == "routed#1"


@pytest.mark.router(a_params={"timeout": 0.5})
def test_a_deployment_timeout_is_honoured_and_retried_elsewhere(routed: RunningGateway, fake: FakeUpstream,
                                                                other: FakeUpstream) -> None:
    fake.script_message({"content": "too late"}, delay=3)
    other.script_message({"content": "in time"})
    started = time.monotonic()
    response = httpx.post(f"{routed.api_base}/chat/completions", headers=AUTH,
                          json={"model": "routed", "messages": USER}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "in time"
    assert time.monotonic() - started < 2.5  # A's 0.5 s, not the server's 600 s
    attempts = _run(routed, response)["attempts"]
    assert [(a["deployment"], a["outcome"]) for a in attempts] == [("routed#1", "upstream_timeout"),
                                                                   ("routed#2", "ok")]


@pytest.mark.router(a_params={"rpm": 1})
def test_a_deployment_at_its_rpm_is_passed_over(routed: RunningGateway, fake: FakeUpstream,
                                                other: FakeUpstream) -> None:
    first = httpx.post(f"{routed.api_base}/chat/completions", headers=AUTH,
                       json={"model": "routed", "messages": USER})
    second = httpx.post(f"{routed.api_base}/chat/completions", headers=AUTH,
                        json={"model": "routed", "messages": USER})
    assert first.status_code == second.status_code == 200
    assert _run(routed, first)["deployment"] == "routed#1"
    assert _run(routed, second)["deployment"] == "routed#2"
    assert len(fake.requests) == 1 and len(other.requests) == 1


def test_weights_spread_requests(fake: FakeUpstream, other: FakeUpstream, sqlite_url: str,
                                 tmp_path: Path) -> None:
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, models=[
        _deployment("spread", fake, "model-a", weight=1), _deployment("spread", other, "model-b", weight=1)])
    running, server = start_gateway(settings, fake)
    try:
        with running.client() as client:
            for _ in range(30):
                assert client.post("/v1/chat/completions",
                                   json={"model": "spread", "messages": USER}).status_code == 200
    finally:
        server.stop()
    assert len(fake.requests) + len(other.requests) == 30
    assert len(fake.requests) >= 3 and len(other.requests) >= 3  # both serve (a 1 in 2^26 chance to fail)


def test_the_models_list_names_a_deployed_model_once(routed: RunningGateway) -> None:
    with routed.client() as client:
        ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert ids.count("routed") == 1


# Config: every litellm_params key works or is refused by name.

def _settings(tmp_path: Path, models: list[dict[str, Any]], **extra: Any) -> Any:
    return settings_for("http://127.0.0.1:9/v1", f"sqlite:///{tmp_path}/g.db", tmp_path, models=models, **extra)


@pytest.mark.parametrize("key, value, expected", [
    ("api_bse", "http://x", "did you mean 'api_base'"),
    ("max_budget", 10, "budgets are set per tenant"),
    ("max_retries", 3, "router.num_retries"),
    ("input_cost_per_token_above_200k_tokens", 1e-6, "runs are priced with"),
    ("rpm", 0, "at least 1"),
    ("weight", -1, "above 0"),
    ("frobnicate", 1, "is not a parameter the gateway or LiteLLM reads"),
])
def test_unknown_or_unenforced_litellm_params_are_refused_by_name(tmp_path: Path, key: str, value: Any,
                                                                   expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _settings(tmp_path, [{"name": "m", "litellm_params": {"model": "openai/x", key: value}}])
    assert caught.value.field.startswith("models[0].litellm_params")
    assert key in str(caught.value) or expected in str(caught.value)
    assert expected in str(caught.value)


def test_a_fallback_to_an_unknown_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _settings(tmp_path, [{"name": "m", "litellm_params": {"model": "openai/x"}}],
                  router={"fallbacks": [{"m": ["nowhere"]}]})
    assert "router.fallbacks" in str(caught.value) and "nowhere" in str(caught.value)


def test_duplicate_deployment_ids_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _settings(tmp_path, [{"name": "m", "id": "one", "litellm_params": {"model": "openai/x"}},
                             {"name": "n", "id": "one", "litellm_params": {"model": "openai/y"}}])
    assert "duplicate deployment id" in str(caught.value)


def test_every_accepted_key_is_one_litellm_or_the_gateway_reads() -> None:
    """The accepted names are LiteLLM's own (its deployment params, or its call's arguments), or the
    gateway's routing and pricing keys: a rename in LiteLLM shows here."""
    import inspect

    from litellm.types.router import LiteLLM_Params

    from gateway.upstream.deployment_params import PRICING_KEYS, ROUTING_KEYS
    from gateway.upstream.litellm_client.base import litellm

    known = set(LiteLLM_Params.model_fields) | set(inspect.signature(litellm.completion).parameters)
    # Taken through `**kwargs` and sent on: `extra_body` to OpenAI-wire providers, `top_k` to the
    # providers that have it.
    known |= {"extra_body", "top_k"}
    unknown = sorted(accepted_names() - known - ROUTING_KEYS - PRICING_KEYS)
    assert unknown == []
    for name in accepted_names():
        assert refusal(name) is None


# The other routing strategies, measured by the gateway itself.

@pytest.fixture
def strategy_gateway(fake: FakeUpstream, other: FakeUpstream, sqlite_url: str, tmp_path: Path,
                     request: pytest.FixtureRequest) -> Iterator[RunningGateway]:
    strategy, a_params, b_params = request.param
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, models=[
        _deployment("pair", fake, "model-a", **a_params), _deployment("pair", other, "model-b", **b_params)],
        router={"routing_strategy": strategy})
    running, server = start_gateway(settings, fake)
    yield running
    server.stop()


def _deployments_of(gateway: RunningGateway, count: int) -> list[str]:
    out = []
    with gateway.client() as client:
        for _ in range(count):
            response = client.post("/v1/chat/completions", json={"model": "pair", "messages": USER})
            assert response.status_code == 200
            out.append(_run(gateway, response)["deployment"])
    return out


@pytest.mark.parametrize("strategy_gateway", [("latency-based-routing", {}, {})], indirect=True)
def test_latency_based_routing_prefers_the_faster_deployment(strategy_gateway: RunningGateway,
                                                             fake: FakeUpstream) -> None:
    fake.state.default_delay = 0.4  # A answers slowly
    try:
        first_two = _deployments_of(strategy_gateway, 2)
        assert sorted(first_two) == ["pair#1", "pair#2"]  # each measured once (unmeasured go first)
        assert _deployments_of(strategy_gateway, 4) == ["pair#2"] * 4
    finally:
        fake.state.default_delay = 0.0


@pytest.mark.parametrize("strategy_gateway", [
    ("cost-based-routing", {"input_cost_per_token": 1e-5, "output_cost_per_token": 3e-5},
     {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6})], indirect=True)
def test_cost_based_routing_prefers_the_cheaper_deployment(strategy_gateway: RunningGateway) -> None:
    assert _deployments_of(strategy_gateway, 4) == ["pair#2"] * 4


@pytest.mark.parametrize("strategy_gateway", [("usage-based-routing-v2", {}, {})], indirect=True)
def test_usage_based_routing_spreads_tokens(strategy_gateway: RunningGateway) -> None:
    used = _deployments_of(strategy_gateway, 4)
    assert used[0] != used[1] and used[2] != used[3]  # the less used one each time a count differs
    assert sorted(used) == ["pair#1", "pair#1", "pair#2", "pair#2"]


@pytest.mark.parametrize("strategy_gateway", [("least-busy", {}, {})], indirect=True)
def test_least_busy_routing_passes_over_a_deployment_with_a_call_in_flight(
        strategy_gateway: RunningGateway, fake: FakeUpstream, other: FakeUpstream) -> None:
    for server in (fake, other):
        server.script_message({"content": "one two three four five six"}, chunk_delay=0.3)
    with strategy_gateway.client() as client:
        with client.stream("POST", "/v1/chat/completions",
                           json={"model": "pair", "messages": USER, "stream": True}) as streaming:
            lines = streaming.iter_lines()
            next(line for line in lines if line.startswith("data: "))  # the stream is open upstream
            busy = streaming.headers["x-gateway-request-id"]
            response = client.post("/v1/chat/completions", json={"model": "pair", "messages": USER})
            assert response.status_code == 200
            for _ in lines:
                pass
    busy_deployment = _run(strategy_gateway, streaming)["deployment"]
    assert busy and _run(strategy_gateway, response)["deployment"] != busy_deployment
