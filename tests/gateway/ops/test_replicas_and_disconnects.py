"""Several replicas on one PostgreSQL, and clients that hang up mid-stream."""
from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path

import httpx

from gateway.commands.replay import load_trace, trace_turns
from testkit.gateway import RunningGateway, settings_for, start_gateway, trace_files
from testkit.fake_upstream import FakeUpstream

USER = [{"role": "user", "content": "tell me a long story"}]


def test_two_replicas_capture_once_and_forward_the_same_bytes(fake: FakeUpstream, postgres_url: str,
                                                              tmp_path: Path) -> None:
    tenants = [{"id": "acme", "api_keys": ["sk-acme-1"], "policy": "coding-agent"}]
    settings = settings_for(fake.api_base, postgres_url, tmp_path, tenants=tenants)
    one, server_one = start_gateway(settings, fake)
    two, server_two = start_gateway(settings, fake)
    try:
        messages, turns = trace_turns(load_trace(next(p for p in trace_files() if "ponyc-4593" in p.name)))
        requests = [messages[:i] for i in turns]

        def send(pair: tuple[int, list[dict]]) -> tuple[int, str]:
            index, body = pair
            replica = (one, two)[index % 2]
            with replica.client() as http:
                response = http.post("/v1/chat/completions", json={"model": "fake", "messages": body})
            assert response.status_code == 200, response.text
            return index, response.headers["x-gateway-request-id"]

        with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:  # both replicas, out of order
            results = list(pool.map(send, enumerate(requests)))
        tool_results = sum(1 for m in requests[-1] if m["role"] == "tool")
        assert one.store.count_artifacts("acme") == tool_results
        # Any replica projects the same stored state to the same bytes.
        with one.client() as a, two.client() as b:
            a.post("/v1/chat/completions", json={"model": "fake", "messages": requests[-1]})
            first = json.dumps(fake.last_body()["messages"], sort_keys=True)
            b.post("/v1/chat/completions", json={"model": "fake", "messages": requests[-1]})
            second = json.dumps(fake.last_body()["messages"], sort_keys=True)
            assert first == second and "[compacted artifact:" in first
            records = [a.get(f"/api/requests/{rid}").json() for _, rid in results]
        assert {r["status"] for r in records} == {"ok"}
    finally:
        server_one.stop()
        server_two.stop()


def _wait_for_status(gateway: RunningGateway, request_id: str) -> dict:
    deadline = time.monotonic() + 10
    with gateway.client() as http:
        while True:
            record = http.get(f"/api/requests/{request_id}").json()
            if record["status"] != "pending" or time.monotonic() > deadline:
                return record
            time.sleep(0.05)


def test_client_hanging_up_mid_stream_is_recorded(gateway: RunningGateway) -> None:
    gateway.fake.script(message={"role": "assistant", "content": "once upon a time " * 40}, chunk_delay=0.05)
    with httpx.Client(base_url=gateway.url, headers={"Authorization": "Bearer sk-acme-1"}, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions",
                         json={"model": "fake", "messages": USER, "stream": True}) as response:
            request_id = response.headers["x-gateway-request-id"]
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
        # leaving the block closes the connection with most of the story unsent
    record = _wait_for_status(gateway, request_id)
    assert record["status"] == "client_disconnected"
    assert record["error"]["type"] == "client_disconnected"
    assert gateway.store.count_artifacts() == 0 and record["message_count"] == 1  # what was captured stays
