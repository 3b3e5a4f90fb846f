"""What an operator reads (issue 13): JSON access logs, request ids end to end, `/metrics` behind a
token, `/docs` behind a switch."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import sqlalchemy
import yaml

from gateway.ops.logs import MAX_LINE, JsonFormatter, TextFormatter
from scripts.processes import TENANT_KEY, Gateway, fake_upstream, free_port, write_config
from testkit.gateway import ADMIN_KEY, RunningGateway, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream

TOOL_ROUND = [
    {"role": "user", "content": "list the files"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "README.md\nsetup.py\n" * 50},
]


def test_gateway_serve_logs_one_json_object_per_line_with_the_request_and_its_run(
        sqlite_url: str, tmp_path: Path) -> None:
    with fake_upstream() as upstream:
        config = write_config(tmp_path, sqlite_url, upstream)
        raw = yaml.safe_load(config.read_text())
        config.write_text(yaml.safe_dump({**raw, "log_level": "info"}))
        gateway = Gateway(config, free_port(), tmp_path / "gateway.log").start()
        try:
            with httpx.Client(base_url=gateway.url, timeout=60) as http:
                ok = http.post("/v1/chat/completions", json={"model": "fake", "messages": TOOL_ROUND},
                               headers={"authorization": f"Bearer {TENANT_KEY}", "x-request-id": "client-7f3a"})
                refused = http.post("/v1/chat/completions", json={"model": "fake", "messages": TOOL_ROUND},
                                    headers={"authorization": "Bearer sk-wrong"})
                upstream_seen = httpx.get(f"{upstream}/_requests").json()
        finally:
            gateway.stop()
    assert ok.status_code == 200 and refused.status_code == 401
    request_id = ok.headers["x-gateway-request-id"]
    assert ok.headers["x-request-id"] == "client-7f3a"  # the client's own id comes back
    assert refused.headers["x-request-id"] == refused.headers["x-gateway-request-id"]  # else the gateway's
    # the provider is told the run's id
    assert upstream_seen[-1]["headers"]["x-client-request-id"] == request_id

    lines = [line for line in (tmp_path / "gateway.log").read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object, startup lines included
    access = {r["request_id"]: r for r in records if r["logger"] == "gateway.access"}
    line = access[request_id]
    assert line["client_request_id"] == "client-7f3a" and line["method"] == "POST"
    assert (line["path"], line["status"], line["tenant"], line["model"]) == ("/v1/chat/completions", 200, "acme", "fake")
    assert (line["deployment"], line["upstream_model"], line["wire_format"], line["run_status"]) == (
        "fake#1", "openai/fake", "openai.chat", "ok")
    assert line["tokens_sent"] > 0 and 0 < line["tokens_forwarded"] <= line["tokens_sent"]
    assert line["prompt_tokens"] > 0 and line["latency_ms"] > 0 and line["error_type"] is None
    assert line["level"] == "info" and line["ts"].endswith("Z")
    bad = access[refused.headers["x-gateway-request-id"]]
    assert bad["status"] == 401 and "tenant" not in bad and bad["client_request_id"] is None
    assert not any(r["logger"] == "uvicorn.access" for r in records)  # the gateway's access log replaces it


def test_formatters_carry_the_fields() -> None:
    record = logging.LogRecord("gateway.access", logging.INFO, __file__, 1, "POST %s", ("/v1/x",), None)
    record.fields = {"request_id": "req_1", "tokens_sent": 12, "note": "ünïcode"}
    as_json = json.loads(JsonFormatter().format(record))
    assert (as_json["message"], as_json["request_id"], as_json["tokens_sent"], as_json["note"]) == (
        "POST /v1/x", "req_1", 12, "ünïcode")
    text = TextFormatter().format(record)
    assert "gateway.access req_1 POST /v1/x" in text and "tokens_sent=12" in text  # the request id up front


def test_no_line_passes_the_bound_whatever_an_error_carries() -> None:
    """Issue 27: a database error that held a statement of 65,000 parameters made a 2 MB line. A message,
    a traceback or a field past its share keeps its head and its tail; every line stays within MAX_LINE."""
    statement = "SELECT id FROM model_runs WHERE leaf_node_id IN (" + ", ".join(
        f"%(leaves_{n})s::VARCHAR" for n in range(65_000)) + ")"
    error = sqlalchemy.exc.OperationalError(statement, None, Exception("number of parameters must be between 0 and 65535"))
    try:
        raise error
    except sqlalchemy.exc.OperationalError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("gateway", logging.ERROR, __file__, 1, "unhandled error: %s", (str(error),), exc_info)
    record.fields = {"request_id": "req_1", "path": "/v1/" + "x" * 50_000, "many": list(range(5_000))}
    for formatter in (JsonFormatter(), TextFormatter()):
        text = formatter.format(record)
        assert len(text) <= MAX_LINE
        assert "number of parameters must be between 0 and 65535" in text  # the error's own line survives
        assert "characters cut]" in text and "unhandled error: (builtins.Exception)" in text
    as_json = json.loads(JsonFormatter().format(record))
    assert as_json["message"].startswith("unhandled error:") and as_json["logger"] == "gateway"
    small = logging.LogRecord("gateway", logging.INFO, __file__, 1, "fine", (), None)
    small.fields = {"request_id": "req_2", "path": "/v1/" + "x" * 50_000}
    assert json.loads(JsonFormatter().format(small))["request_id"] == "req_2"  # one long field is cut alone


def test_an_unusable_client_request_id_is_not_echoed(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        response = http.get("/healthz", headers={"x-request-id": "has spaces in it"})
        long = http.get("/healthz", headers={"x-request-id": "x" * 201})
    assert response.headers["x-request-id"] == response.headers["x-gateway-request-id"]
    assert long.headers["x-request-id"] == long.headers["x-gateway-request-id"]


@pytest.fixture
def guarded(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, server={"metrics_token": "metrics-secret-1"})
    running, server = start_gateway(settings, fake)
    yield running
    server.stop()


def test_metrics_need_the_token_or_an_admin_key_when_one_is_set(guarded: RunningGateway) -> None:
    with httpx.Client(base_url=guarded.url, timeout=30) as http:
        missing = http.get("/metrics")
        tenant = http.get("/metrics", headers={"authorization": f"Bearer {TENANT_KEY}"})
        token = http.get("/metrics", headers={"authorization": "Bearer metrics-secret-1"})
        admin = http.get("/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    for refused in (missing, tenant):
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
    assert token.status_code == admin.status_code == 200
    assert "gateway_requests_total" in token.text


def test_metrics_stay_open_without_a_token_and_docs_stay_shut_without_the_switch(gateway: RunningGateway) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        assert http.get("/metrics").status_code == 200
        for path in ("/docs", "/openapi.json", "/redoc"):
            response = http.get(path)
            assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_url"


def test_docs_are_served_when_switched_on(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> None:
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, server={"docs": True})
    running, server = start_gateway(settings, fake)
    try:
        with httpx.Client(base_url=running.url, timeout=30) as http:
            schema = http.get("/openapi.json").json()
            assert http.get("/docs").status_code == 200
    finally:
        server.stop()
    assert "/v1/chat/completions" in schema["paths"]


def test_every_upstream_call_names_the_run(gateway: RunningGateway) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "hi"})
    with gateway.client() as http:
        chat = http.post("/v1/chat/completions", json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]})
        embedding = http.post("/v1/embeddings", json={"model": "fake", "input": "hello"})
    assert chat.status_code == 200 and embedding.status_code == 200
    seen: list[dict[str, Any]] = gateway.fake.requests[-2:]
    assert [r["headers"]["x-client-request-id"] for r in seen] == [
        chat.headers["x-gateway-request-id"], embedding.headers["x-gateway-request-id"]]


@pytest.mark.parametrize("token", ["", " padded ", "sha256:nothex"])
def test_a_malformed_metrics_token_is_refused_by_name(fake: FakeUpstream, sqlite_url: str, tmp_path: Path,
                                                      token: str) -> None:
    from gateway.config import ConfigError
    with pytest.raises(ConfigError, match="metrics_token"):
        settings_for(fake.api_base, sqlite_url, tmp_path, server={"metrics_token": token})
