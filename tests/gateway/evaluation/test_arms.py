"""Control arms (issue 31): `evaluation.holdout_share` of conversations forwarded as sent, sticky per
conversation, each run naming its arm, and the signals per arm equal to what this test counts itself from
the upstream's log.

220 conversations go through a running gateway under coding-agent with `holdout_share: 0.5`. The fake model
answers each conversation by a rule the test knows (a read, sometimes the same read again, then an answer),
and the file's content is an error for some; the test reads each conversation's arm from what the upstream
was sent (a projected request declares the gateway's rehydration tool, a held-out one is the client's body
as sent) and counts requests, repeated calls, tool results, errors and final answers per arm from the
upstream's log, then compares them with `GET /api/evaluation`.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from sqlalchemy import text

from gateway.fake_upstream.state import Step
from policies.presets import _PRESETS
from testkit.fake_upstream import FakeUpstream
from testkit.gateway import ADMIN_KEY, OTHER_TENANT_KEY, TENANT_KEY, RunningGateway, settings_for, start_gateway

CONVERSATIONS = 220
READ_TOOL = {"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                              "parameters": {"type": "object",
                                                             "properties": {"path": {"type": "string"}}}}}
_TASK = re.compile(r"task (\d+)")


def policy(holdout: float) -> dict[str, Any]:
    raw = json.loads(json.dumps(_PRESETS["coding-agent"]))
    raw["evaluation"] = {"holdout_share": holdout}
    return raw


def _start(fake: FakeUpstream, url: str, tmp_path: Path) -> tuple[RunningGateway, Any]:
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy(0.5)))
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "policy.yaml"},
               {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "policy": "coding-agent"}]
    return start_gateway(settings_for(fake.api_base, url, tmp_path, tenants=tenants), fake)


@pytest.fixture
def gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    running, server = _start(fake, sqlite_url, tmp_path)
    yield running
    server.stop()


@pytest.fixture
def any_store_gateway(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    """On SQLite and on PostgreSQL (the evaluation's query is one statement for both)."""
    running, server = _start(fake, storage_url, tmp_path)
    yield running
    server.stop()


def _task(body: dict[str, Any]) -> int:
    user = next(m for m in body["messages"] if m["role"] == "user")
    found = _TASK.search(user["content"])
    assert found, user
    return int(found.group(1))


def _call(path: str, number: int) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{number}", "type": "function",
         "function": {"name": "read_file", "arguments": json.dumps({"path": path})}}]}


def model(body: dict[str, Any]) -> Step:
    """Conversation n: read f{n}; when n % 3 == 0 read it again (a repeated call); then answer."""
    n = _task(body)
    results = sum(1 for m in body["messages"] if m["role"] == "tool")
    if results == 0:
        return Step(message=_call(f"f{n}.txt", 1))
    if results == 1 and n % 3 == 0:
        return Step(message=_call(f"f{n}.txt", 2))
    return Step(message={"role": "assistant", "content": f"Done with task {n}."})


def file_text(n: int) -> str:
    if n % 5 == 0:
        return f"Error: f{n}.txt: permission denied"
    return "\n".join(f"line {i} of file {n}: nothing of note here" for i in range(120))


def converse(client: Any, n: int) -> list[str]:
    """One conversation as an agent sends it (the whole transcript every turn); its request ids."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."},
                                      {"role": "user", "content": f"Please do task {n} and report."}]
    ids = []
    for _ in range(4):
        response = client.post("/v1/chat/completions", json={"model": "fake", "messages": messages,
                                                             "tools": [READ_TOOL]})
        assert response.status_code == 200, response.text
        ids.append(response.headers["x-gateway-request-id"])
        message = response.json()["choices"][0]["message"]
        messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
        if not message.get("tool_calls"):
            return ids
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": file_text(n)})
    raise AssertionError(f"conversation {n} did not end")


def counted_from_the_upstream(fake: FakeUpstream) -> dict[str, dict[str, Any]]:
    """Per arm, what the upstream's log says: conversations, requests, repeated calls, tool results and
    errors, final answers. A request's arm: projected when it declares the gateway's tool."""
    arms: dict[int, set[str]] = {}
    counts = {arm: {"conversations": set(), "requests": 0, "repeated": 0, "results": 0, "errors": 0, "final": 0}
              for arm in ("projected", "holdout")}
    for entry in fake.requests:
        body = entry["body"]
        n = _task(body)
        names = {tool["function"]["name"] for tool in body.get("tools") or ()}
        arm = "projected" if "gateway_rehydrate" in names else "holdout"
        arms.setdefault(n, set()).add(arm)
        count = counts[arm]
        count["conversations"].add(n)
        count["requests"] += 1
        answer = model(body).message or {}
        calls = [c["function"]["arguments"] for c in answer.get("tool_calls") or ()]
        earlier = [c["function"]["arguments"] for m in body["messages"] if m["role"] == "assistant"
                   for c in m.get("tool_calls") or ()]
        count["repeated"] += sum(1 for c in calls if c in earlier)
        count["final"] += not calls
        tail = []
        for message in reversed(body["messages"]):
            if message["role"] != "tool":
                break
            tail.append(message)
        count["results"] += len(tail)
        count["errors"] += sum(1 for m in tail if str(m["content"]).startswith("Error:"))
    assert all(len(seen) == 1 for seen in arms.values()), "a conversation's requests went to both arms"
    return counts


def test_half_the_conversations_are_held_out_and_the_signals_per_arm_match_the_upstreams_log(
        gateway: RunningGateway, fake: FakeUpstream) -> None:
    fake.state.chat_responder = model
    request_ids = {}
    with gateway.client() as client:
        for n in range(CONVERSATIONS):
            request_ids[n] = converse(client, n)
    counts = counted_from_the_upstream(fake)

    # Each arm holds 40 to 60% of the conversations.
    held = len(counts["holdout"]["conversations"])
    assert 0.4 * CONVERSATIONS <= held <= 0.6 * CONVERSATIONS, held

    # A held-out request is the client's body as sent; a projected one carries the gateway's tool.
    holdout_task = min(counts["holdout"]["conversations"])
    sent = [e["body"] for e in fake.requests if _task(e["body"]) == holdout_task]
    assert all("gateway_rehydrate" not in json.dumps(body.get("tools")) for body in sent)

    # Every run names its arm, the same for each request of a conversation, on its record too.
    with gateway.client() as client:
        for n in (holdout_task, min(counts["projected"]["conversations"])):
            arm = "holdout" if n == holdout_task else "projected"
            for request_id in request_ids[n]:
                record = client.get(f"/api/requests/{request_id}").json()
                assert record["evaluation_arm"] == arm
                assert record["evaluation"]["arm"] == arm
                assert record["evaluation"]["policy_version"].startswith("v1-")
    with gateway.store.engine.connect() as connection:
        mixed = connection.execute(text(
            "SELECT conversation_id FROM model_runs GROUP BY conversation_id"
            " HAVING COUNT(DISTINCT evaluation_arm) > 1")).all()
        conversations = connection.scalar(text("SELECT COUNT(DISTINCT conversation_id) FROM model_runs"))
    assert mixed == [] and conversations == CONVERSATIONS

    with gateway.client() as client:
        report = client.get("/api/evaluation").json()
    assert report["enough_data"] is True
    signals = {signal["name"]: signal for signal in report["signals"]}
    for arm, count in counts.items():
        assert report["arms"][arm]["conversations"] == len(count["conversations"])
        assert report["arms"][arm]["requests"] == count["requests"]
        repeated = signals["repeated_calls_per_request"]["arms"][arm]
        assert (repeated["count"], repeated["base"]) == (count["repeated"], count["requests"])
        errors = signals["tool_errors_per_call"]["arms"][arm]
        assert (errors["count"], errors["base"]) == (count["errors"], count["results"])
        assert signals["rounds_per_conversation"]["arms"][arm]["count"] == count["requests"]
        assert signals["final_answer_share"]["arms"][arm]["count"] == len(count["conversations"])
        assert count["final"] == len(count["conversations"])
    # The model does the same in both arms: nothing differs but what projection changes.
    assert signals["repeated_calls_per_request"]["verdict"] == "no_difference"
    assert signals["final_answer_share"]["verdict"] == "no_difference"
    assert signals["tokens_forwarded_per_conversation"]["verdict"] == "better"
    projected_rate = signals["repeated_calls_per_request"]["arms"]["projected"]
    low, high = projected_rate["interval"]
    assert low <= projected_rate["rate"] <= high


def test_the_arm_follows_the_conversation_not_the_request(any_store_gateway: RunningGateway,
                                                          fake: FakeUpstream) -> None:
    """A labelled conversation keeps its arm whatever it sends; a tenant without a holdout is all projected;
    another tenant's key sees none of the first's evaluation."""
    fake.state.chat_responder = model
    with any_store_gateway.client() as client:
        arms = set()
        for turn in range(6):
            response = client.post("/v1/chat/completions", headers={"x-gateway-session": "sticky-1"},
                                   json={"model": "fake", "messages": [
                                       {"role": "user", "content": f"task 1 turn {turn}"}]})
            record = client.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()
            arms.add(record["evaluation_arm"])
        assert len(arms) == 1
    with any_store_gateway.client(OTHER_TENANT_KEY) as other:
        response = other.post("/v1/chat/completions", json={"model": "fake", "messages": [
            {"role": "user", "content": "task 2"}]})
        record = other.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()
        assert record["evaluation_arm"] == "projected"
        report = other.get("/api/evaluation").json()
        assert report["arms"]["projected"]["conversations"] == 1
        assert report["arms"]["holdout"]["conversations"] == 0
        assert report["enough_data"] is False
        assert {s["verdict"] for s in report["signals"]} == {"insufficient_data"}
        assert other.get("/api/evaluation?tenant=acme").status_code == 404
    with any_store_gateway.client(ADMIN_KEY) as admin:
        everyone = admin.get("/api/evaluation").json()
        assert everyone["arms"]["projected"]["conversations"] + everyone["arms"]["holdout"]["conversations"] == 2
        assert admin.get("/api/evaluation?tenant=acme").json()["filters"]["tenant"] == "acme"
        assert admin.get("/api/evaluation?from=yesterday").status_code == 400
