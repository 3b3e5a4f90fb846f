"""Replaying the shared real-agent traces turn by turn through the running gateway.

Every tool result of every trace must be stored byte-exact exactly once, on
SQLite and on PostgreSQL, and be retrievable through the read API.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from testkit.gateway import RunningGateway, load_trace, trace_files

TRACES = trace_files()


def tools_for(messages: list[dict]) -> list[dict]:
    names: list[str] = []
    for m in messages:
        for call in m.get("tool_calls") or []:
            if call["function"]["name"] not in names:
                names.append(call["function"]["name"])
    return [{"type": "function", "function": {"name": n, "description": f"{n} tool",
             "parameters": {"type": "object", "properties": {}, "additionalProperties": True}}}
            for n in names]


def clean(message: dict) -> dict:
    out = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls", "tool_call_id", "name")}
    if out["role"] == "assistant":
        out.setdefault("content", None)
    return out


def replay(gateway: RunningGateway, trace: dict) -> tuple[list[dict], list[str]]:
    messages = [clean(m) for m in trace["messages"]]
    tools = tools_for(messages)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i > 0]
    request_ids = []
    with gateway.client() as http:
        for i in turns:
            gateway.fake.script_message(messages[i])
            body = {"model": "fake", "messages": messages[:i], **({"tools": tools} if tools else {})}
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            request_ids.append(response.headers["x-gateway-request-id"])
    return messages[: turns[-1]], request_ids


def test_traces_are_present() -> None:
    assert len(TRACES) >= 10, f"expected the shared traces in {TRACES}"


@pytest.mark.parametrize("trace_path", TRACES, ids=[p.stem for p in TRACES])
def test_every_tool_result_stored_exactly_once(gateway_any_store: RunningGateway, trace_path: Path) -> None:
    gateway = gateway_any_store
    sent, request_ids = replay(gateway, load_trace(trace_path))
    tool_messages = [m for m in sent if m["role"] == "tool"]
    assert gateway.store.count_artifacts("acme") == len(tool_messages)

    with gateway.client() as http:
        last = http.get(f"/api/requests/{request_ids[-1]}").json()
        assert len(last["path_artifact_ids"]) == len(tool_messages)
        captured = []
        for request_id in request_ids:
            captured += http.get(f"/api/requests/{request_id}").json()["captured_artifact_ids"]
        assert sorted(captured) == sorted(last["path_artifact_ids"])  # each captured by exactly one request
        for artifact_id, message in zip(last["path_artifact_ids"], tool_messages):
            raw = http.get(f"/api/artifacts/{artifact_id}")
            assert raw.status_code == 200
            assert raw.content == message["content"].encode("utf-8")
            meta = http.get(f"/api/artifacts/{artifact_id}/metadata").json()
            assert meta["tool_call_id"] == message["tool_call_id"]
            assert meta["bytes"] == len(raw.content)
