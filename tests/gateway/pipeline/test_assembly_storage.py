"""What a request stores of its assembly (issue 11): the decisions that changed since the request before
it on the same path, and each replacement message once per conversation; the inspector's and the API's
views are rebuilt from those and the path, and equal what was forwarded."""
from __future__ import annotations

import json
import sqlite3
import statistics
from pathlib import Path
from typing import Iterator

import pytest

from gateway.commands.replay import replay_trace, trace_turns, wire_message
from policies.presets import preset
from storage.assembly_record import MAX_BASE_DEPTH
from testkit.gateway import RunningGateway, load_trace, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream

TRACE = Path(__file__).resolve().parents[2] / "data" / "traces" / "openhands_codeact_llama4-maverick_ponyc-4588.jsonl"


@pytest.fixture
def coding_gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    tenants = [{"id": "acme", "api_keys": ["sk-acme-1"], "policy": "coding-agent"}]
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, tenants=tenants), fake)
    yield running
    server.stop()


def stored_bytes(db: Path, request_id: str) -> int:
    with sqlite3.connect(db) as connection:
        return connection.execute("SELECT length(decisions_json) FROM context_assemblies WHERE request_id = ?",
                                  (request_id,)).fetchone()[0]


def stored_decisions(db: Path, request_id: str) -> tuple[list[dict], str | None]:
    with sqlite3.connect(db) as connection:
        text, base = connection.execute("SELECT decisions_json, base_request_id FROM context_assemblies "
                                        "WHERE request_id = ?", (request_id,)).fetchone()
    return json.loads(text), base


def test_every_request_rebuilds_to_what_was_forwarded_and_stores_only_what_changed(
        coding_gateway: RunningGateway, tmp_path: Path) -> None:
    gateway = coding_gateway
    trace = load_trace(TRACE)
    offline = []
    replay_trace(preset("coding-agent"), trace, TRACE.name, tenant="acme",
                 on_projection=lambda _request, projection: offline.append(projection))
    messages, turns = trace_turns(trace)
    sizes, stored = [], []
    with gateway.client() as http:
        for turn, end in enumerate(turns):
            gateway.fake.script_message(messages[end])
            response = http.post("/v1/chat/completions", json={"model": "fake", "messages": messages[:end]})
            assert response.status_code == 200, response.text
            request_id = response.headers["x-gateway-request-id"]
            forwarded = [wire_message(m) for m in gateway.fake.last_body()["messages"]]
            rebuilt = http.get(f"/api/requests/{request_id}/projection").json()["messages"]
            assert [wire_message(m) for m in rebuilt] == forwarded
            decisions = http.get(f"/api/requests/{request_id}").json()["assembly"]["decisions"]
            assert [(d["index"], d["action"], d["reason"]) for d in decisions] == [
                (d.index, d.action, d.reason) for d in offline[turn].decisions]
            sizes.append(stored_bytes(tmp_path / "gateway.db", request_id))
            stored.append(stored_decisions(tmp_path / "gateway.db", request_id))
    # A move of the epoch renames the epoch in every memory's reason (`epoch:12` -> `epoch:17`); a memory
    # otherwise recorded as before is not stored again for that: the reader restores the reason.
    checked = 0
    for turn in range(1, len(stored)):
        decisions, base = stored[turn]
        if base is None or offline[turn].epoch_round == offline[turn - 1].epoch_round:
            continue
        before = {d.index: d.as_dict() for d in offline[turn - 1].decisions if d.action == "compacted"}
        checked += len(before)
        for decision in decisions:
            earlier = before.get(decision["index"])
            assert earlier is None or {**earlier, "reason": ""} != {
                k: v for k, v in decision.items() if k != "forwarded"} | {"reason": ""}, decision
    assert checked >= 10  # moves of the epoch past earlier memories happened
    quarter = len(sizes) // 4
    early, late = sizes[quarter:2 * quarter], sizes[-quarter:]
    # the transcript is four times longer by the end; what a request stores is not
    assert statistics.median(late) <= max(64, statistics.median(early))
    with sqlite3.connect(tmp_path / "gateway.db") as connection:
        whole = connection.execute("SELECT count(*) FROM context_assemblies WHERE base_request_id IS NULL").fetchone()[0]
    assert whole <= 2 + len(sizes) // (MAX_BASE_DEPTH - 1)  # a chain is cut every MAX_BASE_DEPTH requests


def test_a_gateway_that_does_not_hold_the_base_stores_the_decisions_whole(
        fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> None:
    trace = load_trace(TRACE)
    messages, turns = trace_turns(trace)
    tenants = [{"id": "acme", "api_keys": ["sk-acme-1"], "policy": "coding-agent"}]
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, tenants=tenants)
    ids = []
    for replica in range(2):  # a restart between the two halves: nothing held in memory
        gateway, server = start_gateway(settings, fake)
        try:
            with gateway.client() as http:
                for end in turns[replica * 20:(replica + 1) * 20]:
                    fake.script_message(messages[end])
                    response = http.post("/v1/chat/completions", json={"model": "fake", "messages": messages[:end]})
                    ids.append((response.headers["x-gateway-request-id"], wire_message_list(fake.last_body())))
        finally:
            server.stop()
    with sqlite3.connect(tmp_path / "gateway.db") as connection:
        bases = dict(connection.execute("SELECT request_id, base_request_id FROM context_assemblies"))
    assert bases[ids[20][0]] is None  # whole after the restart (the base is in no memory) ...
    assert sum(bases[request_id] is not None for request_id, _ in ids[21:]) >= 10  # ... then deltas again
    gateway, server = start_gateway(settings, fake)
    try:
        with gateway.client() as http:
            for request_id, forwarded in ids:
                rebuilt = http.get(f"/api/requests/{request_id}/projection").json()["messages"]
                assert [wire_message(m) for m in rebuilt] == forwarded
    finally:
        server.stop()


def wire_message_list(body: dict) -> list[dict]:
    return [wire_message(m) for m in body["messages"]]
