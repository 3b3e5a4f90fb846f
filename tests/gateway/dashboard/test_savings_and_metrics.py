"""The savings ledger (`/api/savings`) and `/metrics`, after traces replayed through the gateway."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.commands.replay import load_trace, trace_turns
from testkit.gateway import ADMIN_KEY, OTHER_TENANT_KEY, RunningGateway, settings_for, start_gateway, trace_files
from testkit.fake_upstream import FakeUpstream

PRICES = {"input_cost_per_token": 3e-6, "output_cost_per_token": 1.5e-5, "cache_read_input_token_cost": 3e-7}


@pytest.fixture
def priced(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    models = [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": fake.api_base,
                                                   "api_key": "x", **PRICES}},
              {"name": "fake-b", "litellm_params": {"model": "openai/fake-b", "api_base": fake.api_base,
                                                     "api_key": "x", **PRICES}}]
    tenants = [{"id": "acme", "api_keys": ["sk-acme-1"], "policy": "coding-agent"},
               {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "policy": "default"}]
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, models=models,
                                                 tenants=tenants), fake)
    yield running
    server.stop()


def replay(gateway: RunningGateway, name: str, model: str = "fake", key: str = "sk-acme-1",
           session: str | None = None) -> list[httpx.Response]:
    trace = load_trace(next(p for p in trace_files() if name in p.name))
    messages, turns = trace_turns(trace)
    responses = []
    with gateway.client(key=key) as http:
        for i in turns:
            gateway.fake.script_message(messages[i])
            headers = {"x-gateway-session": session} if session else {}
            response = http.post("/v1/chat/completions", json={"model": model, "messages": messages[:i]},
                                 headers=headers)
            assert response.status_code == 200, response.text
            responses.append(response)
    return responses


def test_ledger_sums_what_the_runs_recorded(priced: RunningGateway) -> None:
    responses = replay(priced, "ponyc-4593", session="fix-4593")
    sent = sum(int(r.headers["x-gateway-tokens-original"]) for r in responses)
    forwarded = sum(int(r.headers["x-gateway-tokens-forwarded"]) for r in responses)
    with priced.client() as http:
        ledger = http.get("/api/savings").json()
    totals = ledger["totals"]
    assert totals["requests"] == len(responses)
    assert (totals["tokens_sent"], totals["tokens_forwarded"]) == (sent, forwarded)
    assert totals["tokens_saved"] == sent - forwarded and totals["tokens_saved_share"] > 0.3
    assert totals["cached_tokens"] > 0  # the fake upstream's prefix cache hit between epochs
    assert 0 < totals["cost_usd"] < totals["cost_original_usd"]
    assert totals["saved_usd"] == pytest.approx(totals["cost_original_usd"] - totals["cost_usd"], abs=1e-6)
    assert [s["session"] for s in ledger["by_session"]] == ["fix-4593"]
    assert [m["model"] for m in ledger["by_model"]] == ["fake"] and len(ledger["by_day"]) == 1
    with priced.client() as http:  # each run's record carries the same figures
        runs = [http.get(f"/api/requests/{r.headers['x-gateway-request-id']}").json() for r in responses]
    assert sum(r["cost_usd"] for r in runs) == pytest.approx(totals["cost_usd"], abs=1e-6)


def test_ledger_filters_and_scopes(priced: RunningGateway) -> None:
    replay(priced, "task2", model="fake", session="s-a")
    replay(priced, "rev_rock", model="fake-b", session="s-b")
    replay(priced, "minisweagent", key=OTHER_TENANT_KEY)
    with priced.client() as http:
        everything = http.get("/api/savings").json()
        by_model = http.get("/api/savings", params={"model": "fake-b"}).json()
        by_session = http.get("/api/savings", params={"session": "s-a"}).json()
        tomorrow = http.get("/api/savings", params={"start": "2099-01-01"}).json()
        assert {s["session"] for s in everything["by_session"]} == {"s-a", "s-b"}  # acme only
        assert by_model["totals"]["requests"] + by_session["totals"]["requests"] == everything["totals"]["requests"]
        assert tomorrow["totals"]["requests"] == 0
        assert http.get("/api/savings", params={"tenant": "globex"}).status_code == 404
        bad = http.get("/api/savings", params={"start": "yesterday"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "start"
    with priced.client(key=ADMIN_KEY) as http:
        admin = http.get("/api/savings").json()
        globex = http.get("/api/savings", params={"tenant": "globex"}).json()
    assert {t["tenant"] for t in admin["by_tenant"]} == {"acme", "globex"}
    assert admin["totals"]["requests"] == everything["totals"]["requests"] + globex["totals"]["requests"]


def test_metrics_parse_and_match_the_ledger(priced: RunningGateway) -> None:
    replay(priced, "ponyc-4595")
    replay(priced, "minisweagent", key=OTHER_TENANT_KEY)
    with priced.client() as http:
        http.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        assert http.get("/api/requests/req_nope").status_code == 404  # an error of the api, not of a model
        text = http.get("/metrics").text
    with priced.client(key=ADMIN_KEY) as http:
        ledger = http.get("/api/savings").json()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value

    def total(name: str) -> float:
        return sum(v for (n, _), v in samples.items() if n == name)

    assert total("gateway_tokens_sent_total") == ledger["totals"]["tokens_sent"]
    assert total("gateway_tokens_forwarded_total") == ledger["totals"]["tokens_forwarded"]
    assert total("gateway_cached_tokens_total") == ledger["totals"]["cached_tokens"]
    assert total("gateway_requests_total") == ledger["totals"]["requests"]
    assert samples[("gateway_errors_total", (("surface", "model"), ("type", "model_not_found")))] == 1
    assert sum(v for (n, labels), v in samples.items()
               if n == "gateway_errors_total" and dict(labels)["surface"] == "api") == 1
    assert not [n for n, _ in samples if n.endswith("_created")]  # each series once, no creation-time twin
    assert total("gateway_assembly_seconds_count") == ledger["totals"]["requests"]
    assert any(n == "gateway_upstream_seconds_bucket" for n, _ in samples)
    by_tenant = {dict(labels)["tenant"]: v for (n, labels), v in samples.items() if n == "gateway_tokens_sent_total"}
    assert by_tenant["acme"] == next(t["tokens_sent"] for t in ledger["by_tenant"] if t["tenant"] == "acme")


def test_conversations_sharing_a_system_prompt_are_separate_sessions(priced: RunningGateway) -> None:
    system = {"role": "system", "content": "You are the same agent every time."}
    with priced.client() as http:
        for opening in ("Fix bug 1.", "Fix bug 2."):
            for turn in range(2):
                messages = [system, {"role": "user", "content": opening}]
                messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}][: 2 * turn]
                assert http.post("/v1/chat/completions", json={"model": "fake", "messages": messages}).status_code == 200
        ledger = http.get("/api/savings").json()
        assert sorted(s["requests"] for s in ledger["by_session"]) == [2, 2]  # one tree, two conversations
        one = ledger["by_session"][0]["session"]
        assert http.get("/api/savings", params={"session": one}).json()["totals"]["requests"] == 2
