"""Memories that follow the question, through a running gateway (issue 32): a business agent's loop with the
`openai` SDK pulls a 260-line shipment log, works on, then the user asks about one order. The upstream
receives the log as a memory holding that order's row (with its line number, the gaps named exactly), the
same bytes on the requests after, and the record says the line was kept because it was asked about."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import openai
import pytest

from testkit.fake_upstream import FakeUpstream
from testkit.gateway import TENANT_KEY, RunningGateway, settings_for, start_gateway
from tests.policies.test_follow_question import ASKED_ROW, ORDER, ROWS, desk


@pytest.fixture
def desk_gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "coding-agent"}]
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, tenants=tenants), fake)
    yield running
    server.stop()


def log_as_forwarded(body: dict[str, Any]) -> str:
    return next(m["content"] for m in body["messages"] if m.get("tool_call_id") == "c1")


def test_the_asked_for_row_reaches_the_upstream_in_the_logs_memory(desk_gateway: RunningGateway) -> None:
    client = openai.OpenAI(base_url=desk_gateway.api_base, api_key=TENANT_KEY, max_retries=0)
    messages = desk()
    replies = []
    for question in (None, f"Which carrier has order {ORDER}, and when does it arrive?"):
        if question:
            messages = messages + [{"role": "user", "content": question}]
        reply = client.chat.completions.with_raw_response.create(model="fake", messages=messages)
        replies.append(reply.headers["x-gateway-request-id"])
    before, after = (log_as_forwarded(r["body"]) for r in desk_gateway.fake.requests[-2:])
    assert before.startswith("[compacted artifact:art_") and ORDER not in before
    assert f"L{ASKED_ROW + 1}: {ROWS[ASKED_ROW]}" in after
    assert f"[lines 2-{ASKED_ROW} omitted]" in after and "260 lines" in after

    # the agent looks the order up: the memory it answered from stays the same bytes
    messages = messages + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "type": "function", "function": {
            "name": "track_order", "arguments": json.dumps({"order": ORDER})}}]},
        {"role": "tool", "tool_call_id": "t1", "content": json.dumps({"order": ORDER, "scan": "Lyon hub"})}]
    client.chat.completions.create(model="fake", messages=messages)
    assert log_as_forwarded(desk_gateway.fake.requests[-1]["body"]) == after

    with desk_gateway.client() as http:
        record = http.get(f"/api/requests/{replies[-1]}").json()
    log = next(d for d in record["assembly"]["decisions"] if d["index"] == 3)
    assert log["action"] == "compacted" and f"{ASKED_ROW + 1} asked" in log["kept"]
