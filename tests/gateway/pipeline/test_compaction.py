"""Remote compaction through the gateway (gateway/pipeline/compaction.py, compaction_refs.py; issue 32).

`POST /v1/responses/compact` and a Responses request ending in `compaction_trigger` (Codex 0.169.0's),
forwarded to the fake's `/v1/responses/compact` on an OpenAI deployment, answered by the gateway on an
Anthropic one (the fake's /v1/messages has no such endpoint) or when the provider answers 404; the
gateway's item fed back as input is the stored transcript again; forged, foreign and stale items are
refused; every compaction is a row `GET /api/compactions` lists, tenant-scoped.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from gateway.fake_upstream.state import Step
from tests.conftest import ADMIN_KEY, OTHER_TENANT_KEY, TENANT_KEY, RunningGateway, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream

OUTPUT = "\n".join(f"line {n}: " + "x" * 40 for n in range(200))
HISTORY = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]},
    {"type": "function_call", "call_id": "call_ls", "name": "exec_command", "arguments": '{"cmd": "ls"}'},
    {"type": "function_call_output", "call_id": "call_ls", "output": OUTPUT},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listed them."}]},
]
TRIGGER = {"type": "compaction_trigger"}


@pytest.fixture
def gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    models = [
        {"name": "gpt", "litellm_params": {"model": "openai/gpt-5", "api_base": fake.api_base, "api_key": "sk-upstream"}},
        {"name": "claude", "litellm_params": {"model": "anthropic/claude-sonnet-4-5", "api_base": fake.url,
                                              "api_key": "sk-ant-upstream", "drop_params": True}},
    ]
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "coding-agent"},
               {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "policy": "coding-agent"}]
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, models=models,
                                                 tenants=tenants), fake)
    yield running
    server.stop()


def post(gateway: RunningGateway, path: str, body: dict[str, Any], key: str = TENANT_KEY) -> httpx.Response:
    with gateway.client(key) as http:
        return http.post(path, json=body)


def compactions(gateway: RunningGateway, key: str = TENANT_KEY) -> list[dict[str, Any]]:
    with gateway.client(key) as http:
        return http.get("/api/compactions").json()["data"]


def compact_calls(fake: FakeUpstream) -> list[dict[str, Any]]:
    return [r for r in fake.requests if r.get("path") == "/v1/responses/compact"]


def gateway_item(gateway: RunningGateway, key: str = TENANT_KEY) -> dict[str, Any]:
    """The gateway's own compaction item for HISTORY (compacted on the Anthropic deployment)."""
    answer = post(gateway, "/v1/responses", {"model": "claude", "input": [*HISTORY, TRIGGER]}, key)
    assert answer.status_code == 200, answer.text
    [item] = answer.json()["output"]
    return item


def test_compact_endpoint_is_forwarded_to_the_providers_own(gateway: RunningGateway) -> None:
    body = {"model": "gpt", "input": HISTORY, "instructions": "Be brief.",
            # hostile fields: none of them chooses where the compaction goes or with what credentials
            "api_base": "http://127.0.0.2:9/v1", "api_key": "sk-evil", "extra_headers": {"x-evil": "1"},
            "base_url": "http://127.0.0.2:9/v1"}
    answer = post(gateway, "/v1/responses/compact", body)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["object"] == "response.compaction" and data["id"].startswith("resp_")
    assert data["output"][-1]["type"] == "compaction"
    assert data["output"][-1]["encrypted_content"].startswith("fake-compaction:")
    assert data["usage"]["input_tokens"] > 0
    [call] = compact_calls(gateway.fake)
    assert set(call["body"]) == {"model", "input", "instructions"}
    assert call["body"]["model"] == "gpt-5" and call["body"]["instructions"] == "Be brief."
    assert call["headers"]["authorization"] == "Bearer sk-upstream" and "x-evil" not in call["headers"]
    [record] = compactions(gateway)
    assert record["source"] == "provider" and record["endpoint"] == "responses/compact"
    assert record["model"] == "gpt" and record["input_tokens"] > 0 and record["forwarded_tokens"] > 0
    assert record["output_items"] == len(data["output"])
    assert record["request_id"] == "req_" + data["id"].removeprefix("resp_")


def test_a_provider_without_the_endpoint_gets_the_gateways_compaction(gateway: RunningGateway) -> None:
    gateway.fake.state.compact_endpoint = False
    answer = post(gateway, "/v1/responses/compact", {"model": "gpt", "input": HISTORY})
    assert answer.status_code == 200, answer.text
    [item] = answer.json()["output"]
    assert item["type"] == "compaction" and item["encrypted_content"].startswith("gwc1.")
    assert len(compact_calls(gateway.fake)) == 1  # asked, answered 404
    [record] = compactions(gateway)
    assert record["source"] == "gateway" and record["id"] == item["id"] and record["forwarded_tokens"] == 0


def test_codex_trigger_on_anthropic_is_answered_by_the_gateway(gateway: RunningGateway) -> None:
    with gateway.client() as http, http.stream("POST", "/v1/responses",
                                               json={"model": "claude", "input": [*HISTORY, TRIGGER],
                                                     "stream": True}) as answer:
        assert answer.status_code == 200
        events = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    [item] = events[-1]["response"]["output"]
    assert item["type"] == "compaction" and item["encrypted_content"].startswith("gwc1.")
    assert events[3]["item"] == item
    assert not compact_calls(gateway.fake)
    assert not [r for r in gateway.fake.requests if r.get("path") == "/v1/messages"]  # no model was asked
    [record] = compactions(gateway)
    assert (record["source"], record["endpoint"], record["id"]) == ("gateway", "responses", item["id"])
    assert record["input_items"] == 4  # the user's message, the call's turn, its output, the answer


def test_codex_trigger_on_openai_gives_the_providers_item_alone(gateway: RunningGateway) -> None:
    answer = post(gateway, "/v1/responses", {"model": "gpt", "input": [*HISTORY, TRIGGER]})
    assert answer.status_code == 200, answer.text
    [item] = answer.json()["output"]  # exactly one item, as Codex wants: not the user messages beside it
    assert item["type"] == "compaction" and item["encrypted_content"].startswith("fake-compaction:")
    [call] = compact_calls(gateway.fake)
    assert TRIGGER not in call["body"]["input"] and call["body"]["input"][0]["role"] == "user"
    assert not [r for r in gateway.fake.requests if r.get("path") == "/v1/responses"]


def test_the_gateways_item_comes_back_as_the_stored_transcript(gateway: RunningGateway) -> None:
    item = gateway_item(gateway)
    gateway.fake.state.responder = lambda body: Step(blocks=[{"type": "text", "text": "done"}])
    follow = [HISTORY[0], item, {"type": "message", "role": "user", "content": "Now count them."}]
    answer = post(gateway, "/v1/responses", {"model": "claude", "input": follow})
    assert answer.status_code == 200, answer.text
    [sent] = [r["body"] for r in gateway.fake.requests if r.get("path") == "/v1/messages"]
    text = json.dumps(sent["messages"])
    assert "gwc1." not in text  # the reference never reaches the provider
    assert text.count("List the files.") == 1  # the message kept beside the item is the transcript's own
    assert "Listed them." in text and "Now count them." in text
    assert any(b.get("type") == "tool_result" for m in sent["messages"] if isinstance(m["content"], list)
               for b in m["content"])
    # the expanded request continues the compacted one in the tenant's tree: the same conversation
    with gateway.client() as http:
        runs = [http.get(f"/api/requests/req_{r.removeprefix('resp_')}").json()
                for r in (answer.json()["id"],)]
    [record] = compactions(gateway)
    assert runs[0]["conversation_id"] == record["conversation_id"]


def test_a_forged_foreign_or_stale_item_is_refused(gateway: RunningGateway) -> None:
    item = gateway_item(gateway)
    payload, mac = item["encrypted_content"].rsplit(".", 1)
    forged = {**item, "encrypted_content": f"{payload}.{'0' * len(mac)}"}
    for key, bad, code in ((TENANT_KEY, forged, "invalid_compaction"), (OTHER_TENANT_KEY, item, "invalid_compaction")):
        answer = post(gateway, "/v1/responses", {"model": "claude", "input": [bad, {"role": "user", "content": "go"}]},
                      key)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == code and answer.json()["error"]["type"] == "invalid_request_error"
        assert answer.json()["error"]["param"] == "input"
    [record] = compactions(gateway)
    with gateway.client() as http:
        deleted = http.delete(f"/api/sessions/{record['conversation_id']}")
        assert deleted.status_code == 200 and deleted.json()["deleted"]["compactions"] == 1
    assert compactions(gateway) == []  # deleting the conversation deleted its compactions
    answer = post(gateway, "/v1/responses", {"model": "claude", "input": [item, {"role": "user", "content": "go"}]})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "compaction_not_found"


def test_compactions_are_tenant_scoped(gateway: RunningGateway) -> None:
    item = gateway_item(gateway)
    theirs = gateway_item(gateway, OTHER_TENANT_KEY)
    assert [c["id"] for c in compactions(gateway)] == [item["id"]]
    assert [c["id"] for c in compactions(gateway, OTHER_TENANT_KEY)] == [theirs["id"]]
    assert {c["id"] for c in compactions(gateway, ADMIN_KEY)} == {item["id"], theirs["id"]}
    with gateway.client() as http:
        assert http.get(f"/api/compactions/{item['id']}").json()["tenant"] == "acme"
        assert http.get(f"/api/compactions/{theirs['id']}").status_code == 404
        record = http.get(f"/api/compactions/{item['id']}").json()
        run = http.get(f"/api/requests/{record['request_id']}").json()
        assert [c["id"] for c in run["compactions"]] == [item["id"]]
        assert http.get("/api/compactions", params={"conversation": "conv_none"}).json()["data"] == []


def test_the_compact_endpoint_checks_its_caller_and_body(gateway: RunningGateway) -> None:
    answer = httpx.post(f"{gateway.url}/v1/responses/compact", json={"model": "gpt", "input": HISTORY}, timeout=30)
    assert answer.status_code == 401 and "error" in answer.json()
    answer = post(gateway, "/v1/responses/compact", {"model": "gpt"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "input"
    answer = post(gateway, "/v1/responses/compact", {"model": "nope", "input": HISTORY})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"
    answer = post(gateway, "/v1/responses", {"model": "gpt", "input": [TRIGGER, *HISTORY]})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "input[0]"
    answer = post(gateway, "/v1/responses", {"model": "gpt", "input": [{"type": "compaction"}, *HISTORY]})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "input[0].encrypted_content"
    assert compactions(gateway) == [] and not compact_calls(gateway.fake)
