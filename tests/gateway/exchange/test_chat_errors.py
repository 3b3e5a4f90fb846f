"""Bad input, bad keys and upstream failures: OpenAI's error shape, right status, nothing lost."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.schema import MessageNode, ModelRun
from testkit.gateway import ADMIN_KEY, OTHER_TENANT_KEY, RunningGateway, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream

USER = [{"role": "user", "content": "hello"}]


def count(gateway: RunningGateway, model: type) -> int:
    with Session(gateway.store.engine) as session:
        return int(session.scalar(select(func.count()).select_from(model)))


def assert_openai_error(response, status: int, code: str | None = None, error_type: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if code:
        assert error["code"] == code
    if error_type:
        assert error["type"] == error_type
    assert response.headers["x-gateway-request-id"].startswith("req_")
    return error


@pytest.mark.parametrize("headers, status, code", [
    ({}, 401, "missing_api_key"),
    ({"Authorization": "Bearer sk-wrong"}, 401, "invalid_api_key"),
    ({"Authorization": "Basic c2stYWNtZS0x"}, 401, "missing_api_key"),
    ({"Authorization": f"Bearer {ADMIN_KEY}"}, 403, "permission_denied"),
])
def test_keys(gateway: RunningGateway, headers: dict, status: int, code: str) -> None:
    import httpx

    response = httpx.post(f"{gateway.api_base}/chat/completions", headers=headers,
                          json={"model": "fake", "messages": USER})
    assert_openai_error(response, status, code)
    assert count(gateway, ModelRun) == 0


@pytest.mark.parametrize("body, param_part, code", [
    (b"{not json", None, "invalid_json"),
    (b"", None, "invalid_json"),
    (b"[1, 2]", None, "invalid_json"),
    (json.dumps({"model": "fake"}).encode(), "messages", None),
    (json.dumps({"model": "fake", "messages": []}).encode(), "messages", None),
    (json.dumps({"messages": USER}).encode(), "model", None),
    (json.dumps({"model": "fake", "messages": [{"role": "robot", "content": "x"}]}).encode(), "messages[0].role", None),
    (json.dumps({"model": "fake", "messages": [{"role": "user", "content": "x"},
                                               {"role": "tool", "tool_call_id": "c9", "content": "r"}]}).encode(),
     "messages[1]", "invalid_tool_message"),
    (json.dumps({"model": "fake", "messages": [{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                 "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "content": "r"}]}).encode(),
     "messages[1].tool_call_id", None),
    (json.dumps({"model": "fake", "messages": USER, "stream": "yes"}).encode(), "stream", None),
])
def test_invalid_requests_are_400_and_store_nothing(gateway: RunningGateway, body: bytes, param_part, code) -> None:
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    error = assert_openai_error(response, 400, code, "invalid_request_error")
    if param_part:
        assert error["param"] == param_part and param_part in error["message"]
    assert count(gateway, MessageNode) == 0 and count(gateway, ModelRun) == 0
    assert gateway.fake.requests == []


def test_oversized_body(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> None:
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, server={"max_body_bytes": 2000})
    running, server = start_gateway(settings, fake)
    try:
        big = {"model": "fake", "messages": [{"role": "user", "content": "x" * 5000}]}
        with running.client() as http:
            response = http.post("/v1/chat/completions", json=big)
            assert_openai_error(response, 400, "request_too_large")

            def chunked() -> Iterator[bytes]:  # no content-length: the limit holds while reading
                payload = json.dumps(big).encode()
                for i in range(0, len(payload), 500):
                    yield payload[i:i + 500]

            response = http.post("/v1/chat/completions", content=chunked())
            assert_openai_error(response, 400, "request_too_large")
        assert count(running, MessageNode) == 0
    finally:
        server.stop()


def test_unknown_model_is_404(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "gpt-9", "messages": USER})
    assert_openai_error(response, 404, "model_not_found")
    assert count(gateway, MessageNode) == 0


@pytest.mark.parametrize("status, expected_status, error_type", [
    (401, 401, "authentication_error"),
    (429, 429, "rate_limit_error"),
    (500, 500, "api_error"),
    (503, 503, "api_error"),
    (400, 400, "invalid_request_error"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_upstream_errors_reach_the_client(gateway: RunningGateway, status, expected_status, error_type, stream) -> None:
    gateway.fake.script(status=status, headers={"retry-after": "3"} if status == 429 else {})
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": USER, "stream": stream})
    assert_openai_error(response, expected_status, error_type=error_type)
    assert len(gateway.fake.requests) == 1  # no hidden retries
    run_id = response.headers["x-gateway-request-id"]
    with gateway.client() as http:
        record = http.get(f"/api/requests/{run_id}").json()
    assert record["status"] == "error" and record["http_status"] == expected_status
    assert count(gateway, MessageNode) == 1  # the transcript was captured before forwarding


def test_upstream_timeout_is_504(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> None:
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, server={"upstream_timeout_seconds": 0.3})
    running, server = start_gateway(settings, fake)
    try:
        fake.script(delay=1.5)
        with running.client() as http:
            response = http.post("/v1/chat/completions", json={"model": "fake", "messages": USER})
        assert_openai_error(response, 504, "upstream_timeout", "timeout")
    finally:
        server.stop()


def test_stream_broken_midway_ends_with_an_error_event(gateway: RunningGateway) -> None:
    gateway.fake.script(message={"role": "assistant", "content": "a fairly long answer " * 10}, break_stream_after=3)
    with gateway.client() as http:
        with http.stream("POST", "/v1/chat/completions",
                         json={"model": "fake", "messages": USER, "stream": True}) as response:
            assert response.status_code == 200
            request_id = response.headers["x-gateway-request-id"]
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert len(events) >= 2
    last = json.loads(events[-1][len("data: "):])
    assert last["error"]["type"] in ("api_error", "timeout")
    with gateway.client() as http:
        record = http.get(f"/api/requests/{request_id}").json()
    assert record["status"] == "error"


def test_unknown_path_and_method(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        assert_openai_error(http.get("/v1/nothing"), 404, "unknown_url")
        assert_openai_error(http.get("/v1/chat/completions"), 405)


def test_models_and_health(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        models = http.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["fake", "demo"]
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").json() == {"status": "ready"}
    with gateway.client(key="nope") as http:
        assert_openai_error(http.get("/v1/models"), 401)


def test_demo_model_answers_offline(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "demo", "messages": USER})
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "demo says hi"
    assert gateway.fake.requests == []


def test_other_tenant_sees_404_admin_sees_all(gateway: RunningGateway) -> None:
    messages = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "secret acme payload"},
    ]
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": messages})
        request_id = response.headers["x-gateway-request-id"]
        artifact_id = http.get(f"/api/requests/{request_id}").json()["captured_artifact_ids"][0]
        assert http.get(f"/api/artifacts/{artifact_id}").content == b"secret acme payload"
    with gateway.client(key=OTHER_TENANT_KEY) as http:
        assert_openai_error(http.get(f"/api/artifacts/{artifact_id}"), 404, "artifact_not_found")
        assert_openai_error(http.get(f"/api/artifacts/{artifact_id}/metadata"), 404)
        assert_openai_error(http.get(f"/api/requests/{request_id}"), 404, "request_not_found")
    with gateway.client(key=ADMIN_KEY) as http:
        assert http.get(f"/api/artifacts/{artifact_id}").content == b"secret acme payload"
        assert http.get(f"/api/requests/{request_id}").json()["tenant"] == "acme"
    with gateway.client(key="nope") as http:
        assert_openai_error(http.get(f"/api/artifacts/{artifact_id}"), 401)


def test_context_budget_exceeded_is_400(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> None:
    (tmp_path / "tight.yaml").write_text("name: tight\nbudget: {max_prompt_tokens: 40}\n")
    tenants = [{"id": "acme", "api_keys": ["sk-acme-1"], "policy": "tight.yaml"}]
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, tenants=tenants), fake)
    try:
        with running.client() as http:
            response = http.post("/v1/chat/completions", json={"model": "fake", "messages": [
                {"role": "system", "content": "You are a careful agent. " * 20},
                {"role": "user", "content": "Summarise the quarter."}]})
            error = assert_openai_error(response, 400, "context_budget_exceeded", "invalid_request_error")
            assert "40" in error["message"] and error["param"] == "messages"
            record = http.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()
        assert record["status"] == "error" and record["error"]["type"] == "context_budget_exceeded"
        assert fake.requests == []  # nothing went upstream; the transcript itself was captured
        assert count(running, MessageNode) == 2
    finally:
        server.stop()


@pytest.mark.parametrize("headers, param", [
    ({"x-gateway-participant": "p" * 300}, "x-gateway-participant"),
    ({"x-gateway-session": "s" * 300}, "x-gateway-session"),
    ({"x-gateway-parent-request": "not-a-request-id"}, "x-gateway-parent-request"),
])
def test_bad_gateway_headers_are_400_and_store_nothing(gateway_any_store: RunningGateway, headers: dict,
                                                       param: str) -> None:
    with gateway_any_store.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": USER}, headers=headers)
    error = assert_openai_error(response, 400, "invalid_header", "invalid_request_error")
    assert error["param"] == param
    assert count(gateway_any_store, MessageNode) == 0


def test_overlong_ids_are_400_on_every_backend(gateway_any_store: RunningGateway) -> None:
    long_id = "call_" + "x" * 300
    messages = USER + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": long_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": long_id, "content": "r"}]
    with gateway_any_store.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": messages})
    error = assert_openai_error(response, 400, error_type="invalid_request_error")
    assert error["param"] == "messages[1].tool_calls[0].id"
    assert count(gateway_any_store, MessageNode) == 0
