"""An upstream 200 that is not a completion is an upstream error, never a success (issue 8).

Before, a streaming request answered with garbage reached the client as an
empty stream ending in [DONE], recorded `ok`; without streaming it was a 500.
"""
from __future__ import annotations

import json

import pytest

from testkit.gateway import RunningGateway
from tests.gateway.exchange.test_chat_errors import assert_openai_error

USER = [{"role": "user", "content": "hello"}]
GARBAGE = [
    ("truncated JSON", '{"id": "chatcmpl-1", "choices": [{"index": 0, "mess', "application/json"),
    ("empty body", "", "application/json"),
    ("HTML", "<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html"),
    ("JSON without choices", '{"id": "chatcmpl-1", "object": "chat.completion", "usage": {}}', "application/json"),
    ("empty choices", '{"id": "chatcmpl-1", "object": "chat.completion", "choices": []}', "application/json"),
    ("SSE without a finish", 'data: {"id": "x", "choices": []}\n\ndata: [DONE]\n\n', "text/event-stream"),
]


def record(gateway: RunningGateway, response) -> dict:
    with gateway.client() as http:
        return http.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("case, raw, content_type", GARBAGE, ids=[g[0] for g in GARBAGE])
def test_garbage_from_the_upstream_is_502(gateway: RunningGateway, case: str, raw: str, content_type: str,
                                          stream: bool) -> None:
    gateway.fake.script(raw=raw, content_type=content_type)
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": USER, "stream": stream})
    if stream and response.status_code == 200:  # chunks had gone out before the fault showed
        events = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
        assert "[DONE]" not in events
        error = json.loads(events[-1])["error"]
        assert error["code"] == "upstream_error" and error["type"] == "api_error"
    else:  # nothing had reached the client: an ordinary HTTP error
        error = assert_openai_error(response, 502, code="upstream_error", error_type="api_error")
    assert "not a chat completion" in error["message"] or "no completion" in error["message"]
    run = record(gateway, response)
    assert run["status"] == "error" and run["error"]["type"] == "upstream_error" and run["http_status"] == 502


def test_a_stream_broken_after_it_began_ends_in_an_error_event(gateway: RunningGateway) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "a long answer " * 20}, break_stream_after=3)
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": USER, "stream": True})
    events = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
    assert response.status_code == 200
    assert "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "api_error"
    run = record(gateway, response)
    assert run["status"] == "error" and run["error"]["type"] == error["code"]
