"""Hostile input is a 400 that names the parameter, on every backend; nothing is stored or forwarded.

Each case below was a 500 on SQLite or PostgreSQL before (issue 8): deep
nesting, lone surrogates, NaN and Infinity, wrong types inside content parts,
NUL in ids, in the path and in query parameters.
"""
from __future__ import annotations

import json

import httpx
import pytest

from storage.schema import ModelRun
from testkit.gateway import TENANT_KEY, RunningGateway
from tests.gateway.exchange.test_chat_errors import assert_openai_error, count

CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


def body(*messages: dict, **fields) -> bytes:
    return json.dumps({"model": "fake", "messages": list(messages), **fields}).encode()


def deep(levels: int) -> bytes:
    nested = "[" * levels + "]" * levels
    return b'{"model": "fake", "messages": [{"role": "user", "content": "x"}], "metadata": {"x": ' + \
        nested.encode() + b"}}"


CASES = [
    ("nesting 2000 deep", deep(2000), None),
    ("nesting 100 deep", deep(100), "metadata.x" + "[0]" * 62),
    ("lone surrogate in content", b'{"model": "fake", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
     "messages[0].content"),
    ("lone low surrogate in a key", b'{"model": "fake", "messages": [{"role": "user", "content": "x", "\\udc00": 1}]}',
     "messages[0]"),
    ("lone surrogate in tool arguments", body(
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}}]}).replace(
        b'"arguments": "{}"', b'"arguments": "{\\"a\\": \\"\\udfff\\"}"'),
     "messages[1].tool_calls[0].function.arguments"),
    ("NaN", b'{"model": "fake", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}', None),
    ("Infinity", b'{"model": "fake", "messages": [{"role": "user", "content": "x"}], "temperature": Infinity}', None),
    ("-Infinity", b'{"model": "fake", "messages": [{"role": "user", "content": "x"}], "top_p": -Infinity}', None),
    ("text part with a number", body({"role": "user", "content": [{"type": "text", "text": 5}]}),
     "messages[0].content[0].text"),
    ("part without a type", body({"role": "user", "content": [{"text": "x"}]}), "messages[0].content[0]"),
    ("part that is a string", body({"role": "user", "content": ["x"]}), "messages[0].content[0]"),
    ("image part without a url", body({"role": "user", "content": [{"type": "image_url", "image_url": {}}]}),
     "messages[0].content[0].image_url"),
    ("content as a number", body({"role": "user", "content": 5}), "messages[0].content"),
    ("NUL in a tool_call_id", body({"role": "user", "content": "x"}, {**CALL, "tool_calls": [
        {**CALL["tool_calls"][0], "id": "c\u00001"}]}, {"role": "tool", "tool_call_id": "c\u00001", "content": "r"}),
     "messages[1].tool_calls[0].id"),
    ("NUL in a tool name", body({"role": "user", "content": "x"}, {**CALL, "tool_calls": [
        {**CALL["tool_calls"][0], "function": {"name": "f\u0000", "arguments": "{}"}}]}),
     "messages[1].tool_calls[0].function.name"),
    ("NUL in tool arguments", body({"role": "user", "content": "x"}, {**CALL, "tool_calls": [
        {**CALL["tool_calls"][0], "function": {"name": "f", "arguments": "{\u0000}"}}]}),
     "messages[1].tool_calls[0].function.arguments"),
    ("NUL in a name", body({"role": "user", "content": "x", "name": "a\u0000"}), "messages[0].name"),
    ("NUL in the model", body({"role": "user", "content": "x"}).replace(b'"fake"', b'"fa\\u0000ke"'), "model"),
    ("tool_call_id as a number", body({"role": "user", "content": "x"}, CALL,
                                      {"role": "tool", "tool_call_id": 7, "content": "r"}), "messages[2].tool_call_id"),
    ("function tool without a function", body({"role": "user", "content": "x"}, tools=[{"type": "function"}]),
     "tools[0].function"),
    ("stream as a string", body({"role": "user", "content": "x"}, stream="yes"), "stream"),
    ("invalid UTF-8", b'{"model": "fake", "messages": [{"role": "user", "content": "\xff\xfe"}]}', None),
]


@pytest.mark.parametrize("case, raw, param", CASES, ids=[c[0] for c in CASES])
def test_malformed_bodies_are_400_naming_the_parameter(gateway_any_store: RunningGateway, case: str, raw: bytes,
                                                       param: str | None) -> None:
    with gateway_any_store.client() as http:
        response = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    error = assert_openai_error(response, 400, error_type="invalid_request_error")
    if param is not None:
        assert error["param"] == param, error
    assert count(gateway_any_store, ModelRun) == 0
    assert gateway_any_store.fake.requests == []


def test_nul_in_content_is_text_and_is_kept(gateway_any_store: RunningGateway) -> None:
    """NUL inside message text is data, not an id: stored and forwarded byte-exact."""
    messages = [{"role": "user", "content": "a\u0000b"}, CALL, {"role": "tool", "tool_call_id": "c1",
                                                                "content": "out\u0000put"}]
    with gateway_any_store.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": messages})
        assert response.status_code == 200, response.text
        record = http.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()
        artifact = http.get(f"/api/artifacts/{record['captured_artifact_ids'][0]}")
    assert artifact.content == "out\u0000put".encode()
    assert gateway_any_store.fake.last_body()["messages"][0]["content"] == "a\u0000b"


@pytest.mark.parametrize("path, param", [
    ("/api/artifacts/art_%00", "path"),
    ("/api/requests/req_%00x", "path"),
    ("/api/requests/req_%00x/projection", "path"),
    ("/api/artifacts/args_%00/metadata", "path"),
    ("/api/savings?model=a%00b", "model"),
    ("/api/savings?session=%00", "session"),
    ("/api/savings?start=2026-01-01%00", "start"),
    ("/api/savings?tenant=%ff", "tenant"),
    ("/api/savings?%00=1", "query"),
    ("/dashboard?model=%00", "model"),
])
def test_nul_in_paths_and_query_parameters_is_400(gateway_any_store: RunningGateway, path: str, param: str) -> None:
    response = httpx.get(gateway_any_store.url + path, headers={"Authorization": f"Bearer {TENANT_KEY}"})
    error = assert_openai_error(response, 400, error_type="invalid_request_error")
    assert error["param"] == param


def test_nul_in_delete_and_headers_is_400(gateway_any_store: RunningGateway) -> None:
    with gateway_any_store.client() as http:
        assert_openai_error(http.delete("/api/sessions/a%00b"), 400)
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": [{"role": "user",
                                                                                         "content": "x"}]},
                             headers={"x-gateway-session": "a\u00e9\u00ff".encode("latin-1")})  # latin-1 text is fine
        assert response.status_code == 200


@pytest.mark.parametrize("path", ["/api/artifacts/art_0123456789abcdef0123", "/api/artifacts/nonsense",
                                  "/api/artifacts/" + "a" * 5000, "/api/requests/req_" + "0" * 32,
                                  "/api/requests/" + "x" * 300 + "/projection", "/api/artifacts/args_zz/metadata"])
def test_unknown_ids_are_404(gateway_any_store: RunningGateway, path: str) -> None:
    with gateway_any_store.client() as http:
        assert_openai_error(http.get(path), 404, error_type="invalid_request_error")
    with gateway_any_store.client() as http:
        assert_openai_error(http.delete("/api/sessions/" + "z" * 3000), 404)
