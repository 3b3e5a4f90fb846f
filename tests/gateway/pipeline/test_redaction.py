"""Redaction through the running gateway (issue 14): a key in a tool result never reaches the upstream
in a memory, an excerpt or a rehydration answer, and with `redaction.stored` it is not stored either.

The fake upstream records every body it receives; the client sends whole transcripts, the way agents
do, with a secret-bearing result growing old enough to become a memory.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from sqlalchemy import text

from testkit.gateway import OTHER_TENANT_KEY, TENANT_KEY, RunningGateway, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream

KEY = "sk-proj-" + "Zq8Xw7Vu6Ts5Rq4Po3Nm2Lk1Ji0Hg9Fe8Dc7Ba6" * 2
EMAIL = "dana.finance@example.org"
FILLER = "\n".join(f"row {i}: deployment step completed, nothing to report for this line" for i in range(120))
ENV = f"# .env of the billing service\nOPENAI_API_KEY={KEY}\nOWNER={EMAIL}\n{FILLER}\nDEPLOY_TOKEN_HINT=none\n"
BIG = f"{ENV}\n" + "\n".join(f"audit {i}: checksum verified for the release bundle" for i in range(1800))
POLICY = {
    "name": "redaction-test",
    "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 0, "clear_at_least_tokens": 0,
                   "min_tokens": 50, "horizon": 1000},
    "rehydration": {"max_rounds": 2, "max_bytes": 400_000, "max_tokens": 100_000},
}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
         for n in ("read_file", "run_tests")]


@pytest.fixture
def gateway(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    """acme redacts what is forwarded (the default); globex stores artifacts redacted too."""
    (tmp_path / "forwarded.yaml").write_text(yaml.safe_dump(POLICY))
    (tmp_path / "stored.yaml").write_text(yaml.safe_dump({**POLICY, "name": "stored", "redaction": {"stored": True}}))
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "forwarded.yaml"},
               {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "policy": "stored.yaml"}]
    settings = settings_for(fake.api_base, storage_url, tmp_path, tenants=tenants)
    running, server = start_gateway(settings, fake)
    yield running
    server.stop()


def call(call_id: str, name: str, **arguments: Any) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def send(gateway: RunningGateway, messages: list[dict], key: str = TENANT_KEY) -> dict:
    with gateway.client(key=key) as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": messages, "tools": TOOLS})
        assert response.status_code == 200, response.text
        return http.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()


def opening(content: str = ENV) -> list[dict]:
    return [{"role": "system", "content": "You maintain the billing service."},
            {"role": "user", "content": "Check the env, then run the tests."},
            call("c1", "read_file", path=".env"), {"role": "tool", "tool_call_id": "c1", "content": content}]


def later(messages: list[dict]) -> list[dict]:
    return messages + [call("c2", "run_tests"), {"role": "tool", "tool_call_id": "c2", "content": "ok\n" + FILLER}]


def bodies(gateway: RunningGateway) -> list[str]:
    return [json.dumps(r["body"]) for r in gateway.fake.requests]


def test_a_key_never_reaches_the_upstream_in_a_memory_or_a_rehydration_answer(gateway: RunningGateway) -> None:
    # The result as the client sends it, in the latest round: forwarded as sent (the client's own bytes).
    gateway.fake.script_message({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}]})
    send(gateway, opening())
    assert KEY in bodies(gateway)[-1]
    # One round later it is a memory: the key and the mail address are gone, the rest of it is there.
    gateway.fake.reset()
    gateway.fake.script_message({"role": "assistant", "content": "tests pass"})
    messages = later(opening())
    record = send(gateway, messages)
    memory = gateway.fake.last_body()["messages"][3]["content"]
    decision = next(d for d in record["assembly"]["decisions"] if d["index"] == 3)
    assert decision["action"] == "compacted" and "redacted api_key x1, email x1" in decision["kept"]
    assert "OPENAI_API_KEY=[REDACTED:api_key]" in memory and "OWNER=[REDACTED:email]" in memory
    artifact = decision["artifact_id"]
    # The model asks for the raw result, whole and by lines; the user names it: all redacted.
    messages += [{"role": "assistant", "content": "tests pass"},
                 {"role": "user", "content": "What exactly is configured?"}]
    gateway.fake.reset()
    for call_id, arguments in (("gw_1", {"artifact_id": artifact}), ("gw_2", {"artifact_id": artifact, "lines": "1-3"})):
        gateway.fake.script_message(call(call_id, "gateway_rehydrate", **arguments))
    gateway.fake.script_message({"role": "assistant", "content": "an API key and an owner"})
    record = send(gateway, messages)
    whole, lines = (r["body"]["messages"][-1]["content"] for r in gateway.fake.requests[1:3])
    assert whole == ENV.replace(KEY, "[REDACTED:api_key]").replace(EMAIL, "[REDACTED:email]")
    lines = lines.split("\n[gateway_rehydrate: that was the last round")[0]  # the bound's notice follows (2 rounds)
    assert lines.endswith("# .env of the billing service\nOPENAI_API_KEY=[REDACTED:api_key]\nOWNER=[REDACTED:email]")
    given = [d for d in record["assembly"]["decisions"] if d["action"] == "rehydrated"]
    assert [d["redacted"] for d in given] == [{"api_key": 1, "email": 1}, {"api_key": 1, "email": 1}]
    gateway.fake.script_message({"role": "assistant", "content": "here it is"})
    send(gateway, messages + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"show artifact:{artifact}"}])
    assert "[REDACTED:api_key]" in bodies(gateway)[-1]
    for body in bodies(gateway):
        assert KEY not in body and KEY[:20] not in body and EMAIL not in body
    # Stored as sent: this tenant's policy redacts what is forwarded only.
    with gateway.client() as http:
        assert http.get(f"/api/artifacts/{artifact}").content == ENV.encode()
        assert http.get(f"/api/artifacts/{artifact}/metadata").json()["redaction"] is None


def test_stored_redaction_keeps_no_copy_of_the_key(gateway: RunningGateway, storage_url: str, tmp_path: Path) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "tests pass"})
    messages = opening(BIG)
    messages += [call("c2", "read_file", path="notes.txt"), {"role": "tool", "tool_call_id": "c2", "content": ENV}]
    record = send(gateway, messages, key=OTHER_TENANT_KEY)
    assert KEY not in json.dumps(gateway.fake.last_body()["messages"][3])  # BIG's memory
    ids = record["path_artifact_ids"]
    assert len(ids) == 2 and record["captured_artifact_ids"] == ids
    with gateway.client(key=OTHER_TENANT_KEY) as http:
        for artifact, original in zip(ids, (BIG, ENV)):
            stored = original.replace(KEY, "[REDACTED:api_key]").replace(EMAIL, "[REDACTED:email]").encode()
            raw = http.get(f"/api/artifacts/{artifact}")
            assert raw.status_code == 200 and raw.content == stored
            meta = http.get(f"/api/artifacts/{artifact}/metadata").json()
            assert meta["sha256"] == hashlib.sha256(stored).hexdigest() == raw.headers["x-artifact-sha256"]
            assert meta["redaction"] == {"original_sha256": hashlib.sha256(original.encode()).hexdigest(),
                                         "redacted": {"api_key": 1, "email": 1}}
            assert meta["bytes"] == len(stored)
        assert {http.get(f"/api/artifacts/{a}/metadata").json()["storage"] for a in ids} == {"blob", "inline"}
    # Nothing in the artifact table, nor in the blob store, holds the key or the address.
    with gateway.store.engine.connect() as connection:
        rows = connection.execute(text("SELECT * FROM tool_artifacts")).all()
    assert len(rows) == 2
    dump = repr(rows).encode() + b"".join(bytes(v) for row in rows for v in row if isinstance(v, (bytes, memoryview)))
    assert KEY.encode() not in dump and EMAIL.encode() not in dump
    blobs = list((tmp_path / "blobs").rglob("*"))
    assert any(b.is_file() for b in blobs)
    assert not any(KEY.encode() in b.read_bytes() or EMAIL.encode() in b.read_bytes() for b in blobs if b.is_file())
    if storage_url.startswith("sqlite"):  # the whole database file too
        files = [p for p in tmp_path.glob("gateway.db*") if p.is_file()]
        assert files and not any(KEY.encode() in p.read_bytes() for p in files)
    # The model can still ask for the stored (redacted) bytes: they pass their integrity check.
    messages += [{"role": "assistant", "content": "tests pass"}, {"role": "user", "content": "Exact notes?"},
                 call("c3", "run_tests"), {"role": "tool", "tool_call_id": "c3", "content": "ok\n" + FILLER}]
    gateway.fake.reset()
    gateway.fake.script_message(call("gw_1", "gateway_rehydrate", artifact_id=ids[1]))
    gateway.fake.script_message({"role": "assistant", "content": "done"})
    send(gateway, messages, key=OTHER_TENANT_KEY)
    answer = gateway.fake.requests[1]["body"]["messages"][-1]["content"]
    assert answer == ENV.replace(KEY, "[REDACTED:api_key]").replace(EMAIL, "[REDACTED:email]")


def test_a_subagents_results_stay_private_when_stored_redacted(gateway: RunningGateway) -> None:
    """Subagent results are recognised by the hash of what was sent, not of the redacted bytes stored."""
    parent = [{"role": "system", "content": "You orchestrate subagents."}, {"role": "user", "content": "Audit."}]
    gateway.fake.script_message({"role": "assistant", "content": "delegating"})
    parent_id = send(gateway, parent, key=OTHER_TENANT_KEY)["id"]
    rows = "child rows: customer 4411 flagged\n" + ENV
    child = [{"role": "system", "content": "You are a subagent."}, {"role": "user", "content": "Read the env."},
             call("k1", "read_file", path=".env"), {"role": "tool", "tool_call_id": "k1", "content": rows}]
    gateway.fake.script_message({"role": "assistant", "content": "The env holds a key."})
    with gateway.client(key=OTHER_TENANT_KEY) as http:
        response = http.post("/v1/chat/completions", headers={"x-gateway-parent-request": parent_id},
                             json={"model": "fake", "messages": child, "tools": TOOLS})
        assert response.status_code == 200, response.text
    merged = parent + [{"role": "assistant", "content": "delegating"}, call("t1", "read_file", path=".env"),
                       {"role": "tool", "tool_call_id": "t1", "content": rows},
                       call("t2", "run_tests"), {"role": "tool", "tool_call_id": "t2", "content": "ok"}]
    gateway.fake.script_message({"role": "assistant", "content": "noted"})
    record = send(gateway, merged, key=OTHER_TENANT_KEY)
    assert "customer 4411" not in json.dumps(gateway.fake.last_body()["messages"])
    assert record["assembly"]["omissions"]["subagent_private"] == 1
