"""Shadow comparisons (issue 31): after the client has its answer, the unprojected request goes to the same
model in the background; the two next actions are compared and recorded on the run; the spend is its own
line and stops at the day's budget; the client's answer is never delayed or changed.

The fake model answers the gateway's projected requests (they declare the gateway's rehydration tool) at
once, and the shadows (the client's body as sent, without it) after `SHADOW_DELAY` seconds, so a client that
waited for its shadow would show it in its own timings.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

from gateway.fake_upstream.state import Step
from policies.presets import _PRESETS
from testkit.fake_upstream import FakeUpstream
from testkit.gateway import OTHER_TENANT_KEY, TENANT_KEY, RunningGateway, settings_for, start_gateway

SHADOW_DELAY = 3.0
TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}
PRICED = {"name": "priced", "litellm_params": {"model": "openai/fake", "api_key": "sk-upstream",
                                               "input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}}


def policy(**evaluation: Any) -> dict[str, Any]:
    raw = json.loads(json.dumps(_PRESETS["coding-agent"]))
    raw["evaluation"] = evaluation
    return raw


def _projected(body: dict[str, Any]) -> bool:
    return any(t["function"]["name"] == "gateway_rehydrate" for t in body.get("tools") or ())


def _answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def slow_shadows(body: dict[str, Any]) -> Step:
    """The client's request is answered at once; its shadow after SHADOW_DELAY, with the same answer."""
    return Step(message=_answer("The same answer."), delay=0.0 if _projected(body) else SHADOW_DELAY)


def start(fake: FakeUpstream, sqlite_url: str, tmp_path: Path, **evaluation: Any) -> tuple[RunningGateway, Any]:
    (tmp_path / "shadowed.yaml").write_text(yaml.safe_dump(policy(**evaluation)))
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "shadowed.yaml"},
               {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "policy": "coding-agent"}]
    priced = {**PRICED, "litellm_params": {**PRICED["litellm_params"], "api_base": fake.api_base}}
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, tenants=tenants,
                            models=[priced, {"name": "fake", "litellm_params": {
                                "model": "openai/fake", "api_base": fake.api_base, "api_key": "sk-upstream"}}])
    return start_gateway(settings, fake)


@pytest.fixture
def shadowed(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    running, server = start(fake, sqlite_url, tmp_path, shadow_share=1.0, shadow_budget_usd_per_day=10.0)
    yield running
    server.stop()


def ask(client: httpx.Client, text: str, stream: bool = False, model: str = "priced") -> tuple[str, str, float]:
    """One request; its id, the answer's text, and how long the client waited for all of it."""
    body = {"model": model, "stream": stream, "tools": [TOOL],
            "messages": [{"role": "user", "content": text}]}
    began = time.perf_counter()
    if not stream:
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return (response.headers["x-gateway-request-id"], response.json()["choices"][0]["message"]["content"],
                time.perf_counter() - began)
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        text = ""
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
        return response.headers["x-gateway-request-id"], text, time.perf_counter() - began


def shadow_of(client: httpx.Client, request_id: str, timeout: float = 30.0) -> dict[str, Any]:
    """The run's shadow comparison once it is recorded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        evaluation = client.get(f"/api/requests/{request_id}").json()["evaluation"]
        if evaluation["shadow"] is not None:
            return evaluation["shadow"]
        time.sleep(0.1)
    raise AssertionError(f"no shadow recorded for {request_id}")


def test_shadows_never_delay_or_change_the_clients_answer(shadowed: RunningGateway, fake: FakeUpstream) -> None:
    fake.state.chat_responder = slow_shadows
    timings: dict[str, list[float]] = {"with": [], "without": []}
    ids = []
    for key, arm in ((TENANT_KEY, "with"), (OTHER_TENANT_KEY, "without")):
        with shadowed.client(key) as client:
            for turn in range(6):
                request_id, text, waited = ask(client, f"question {turn} for {arm}", stream=turn % 2 == 1)
                assert text == "The same answer."
                timings[arm].append(waited)
                if arm == "with":
                    ids.append(request_id)
    # The shadows take SHADOW_DELAY each, one after another: a client that waited for them would show it.
    assert max(timings["with"]) < SHADOW_DELAY * 0.8, timings
    assert statistics.median(timings["with"]) < statistics.median(timings["without"]) + 0.5, timings
    with shadowed.client() as client:
        for request_id in ids:
            shadow = shadow_of(client, request_id)
            assert shadow["status"] == "ok" and shadow["same_action"] is True and shadow["similarity"] == 1.0
            assert shadow["cost_usd"] > 0
    shadows = [e["body"] for e in fake.requests if not _projected(e["body"])]
    assert len(shadows) == 6  # one per request of the tenant with shadows, none for the other
    assert all(body["messages"][0]["content"].endswith("for with") for body in shadows)
    assert all(not body.get("stream") for body in shadows)


def test_a_days_budget_stops_the_shadows_and_their_spend_is_its_own_line(
        fake: FakeUpstream, storage_url: str, tmp_path: Path) -> None:
    fake.state.chat_responder = lambda body: Step(message=_answer("ok"))
    # Each request is about 2,000 tokens: a shadow costs about $0.002; the budget holds two of them.
    running, server = start(fake, storage_url, tmp_path, shadow_share=1.0, shadow_budget_usd_per_day=0.005)
    try:
        with running.client() as client:
            statuses, costs = [], []
            for turn in range(5):
                request_id, _, _ = ask(client, f"request {turn}: " + "word " * 1600)
                shadow = shadow_of(client, request_id)
                statuses.append(shadow["status"])
                costs.append(shadow["cost_usd"] or 0.0)
            ledger = client.get("/api/savings").json()["totals"]
            report = client.get("/api/evaluation").json()
    finally:
        server.stop()
    assert statuses[:2] == ["ok", "ok"] and set(statuses[2:]) == {"over_budget"}, statuses
    assert 0 < sum(costs) <= 0.005
    assert ledger["evaluation_cost_usd"] == pytest.approx(sum(costs), abs=1e-6)
    # Never counted as savings: what was saved is what the client's transcripts cost less what was forwarded.
    assert ledger["saved_usd"] == pytest.approx(ledger["cost_original_usd"] - ledger["cost_usd"], abs=1e-6)
    assert report["shadow"]["compared"] == 2 and report["shadow"]["spend_usd"] == pytest.approx(sum(costs), abs=1e-6)
    assert len([e for e in fake.requests if not _projected(e["body"])]) == 2


def test_a_shadow_that_fails_is_recorded_and_the_client_never_knows(shadowed: RunningGateway,
                                                                    fake: FakeUpstream) -> None:
    def failing_shadows(body: dict[str, Any]) -> Step:
        if _projected(body):
            return Step(message=_answer("fine"))
        return Step(status=500, error={"message": "shadow exploded", "type": "server_error"})

    fake.state.chat_responder = failing_shadows
    with shadowed.client() as client:
        request_id, text, _ = ask(client, "anything")
        assert text == "fine"
        assert shadow_of(client, request_id)["status"] == "error"
        record = client.get(f"/api/requests/{request_id}").json()
    assert record["status"] == "ok" and record["evaluation"]["shadow"]["cost_usd"] is None


def test_a_shadow_that_answers_otherwise_disagrees(shadowed: RunningGateway, fake: FakeUpstream) -> None:
    def other_minds(body: dict[str, Any]) -> Step:
        if _projected(body):
            return Step(message={"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]})
        return Step(message=_answer("I can answer from what I see."))

    fake.state.chat_responder = other_minds
    with shadowed.client() as client:
        request_id, _, _ = ask(client, "which file?")
        shadow = shadow_of(client, request_id)
    assert shadow == {**shadow, "status": "ok", "same_action": False, "similarity": 0.0}


READ_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
FORMATS = {
    "anthropic": ("/v1/messages", {"model": "priced", "max_tokens": 64, "tools": [
        {"name": "read_file", "input_schema": READ_SCHEMA}], "messages": [{"role": "user", "content": "hello"}]}),
    "responses": ("/v1/responses", {"model": "priced", "input": "hello", "tools": [
        {"type": "function", "name": "read_file", "parameters": READ_SCHEMA}]}),
    "gemini": ("/v1beta/models/priced:generateContent", {
        "contents": [{"role": "user", "parts": [{"text": "hello"}]}],
        "tools": [{"functionDeclarations": [{"name": "read_file", "parameters": READ_SCHEMA}]}]}),
}


@pytest.mark.parametrize("wire", sorted(FORMATS))
def test_every_wire_format_is_shadowed_in_its_own_terms(shadowed: RunningGateway, fake: FakeUpstream,
                                                        wire: str) -> None:
    """The shadow of an Anthropic, Responses or Gemini request is that request as sent, compared as such."""
    path, body = FORMATS[wire]
    with shadowed.client() as client:
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        shadow = shadow_of(client, response.headers["x-gateway-request-id"])
    assert shadow["status"] == "ok" and shadow["same_action"] is True
    sent = [json.dumps(e["body"]) for e in fake.requests]  # the request, then its shadow
    assert len(sent) == 2 and all('"hello"' in body for body in sent)
    assert "gateway_rehydrate" in sent[0] and "gateway_rehydrate" not in sent[1]
