"""Google's Gemini API through the gateway: a Gemini deployment reached through LiteLLM's Gemini path.

The upstream is the fake's `/v1beta/models/{model}:{method}` (gateway/fake_upstream/gemini.py),
reached the way a deployment with `litellm_params.model: gemini/...` is; `gemini-*` is a
wildcard entry, as Gemini CLI users configure it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

from policies.transcript import artifact_id_for, message_path
from testkit.fake_upstream import FakeUpstream
from testkit.gateway import OTHER_TENANT_KEY, TENANT_KEY, RunningGateway, settings_for, start_gateway

MODEL = "gemini-2.5-flash"
EAGER = {"name": "eager", "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 0, "clear_at_least_tokens": 0,
                                         "min_tokens": 50, "horizon": 1000}}
TOOLS = [{"functionDeclarations": [{"name": "read_file", "description": "Reads a file",
                                    "parametersJsonSchema": {"type": "object",
                                                             "properties": {"file_path": {"type": "string"}}}}]}]
SYSTEM = {"parts": [{"text": "You are a coding agent."}], "role": "user"}
FILE = "\n".join(f"{i:4d}  def function_{i}(argument): return argument * {i}  # line of source" for i in range(150))


@pytest.fixture
def gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    (tmp_path / "eager.yaml").write_text(yaml.safe_dump(EAGER))
    models = [{"name": "gemini-*", "litellm_params": {"model": "gemini/gemini-*", "api_base": f"{fake.url}/v1beta",
                                                       "api_key": "upstream-key"}},
              {"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": fake.api_base,
                                                   "api_key": "sk-upstream"}}]
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "eager.yaml"},
               {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "policy": "default", "models": ["fake"]}]
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, models=models,
                                                 tenants=tenants), fake)
    yield running
    server.stop()


def post(gateway: RunningGateway, body: dict, method: str = "generateContent", query: str = "",
         key: str = TENANT_KEY, model: str = MODEL) -> httpx.Response:
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        return http.post(f"/v1beta/models/{model}:{method}{query}", json=body, headers={"x-goog-api-key": key})


def sse_chunks(text: str) -> list[dict]:
    frames = [f for f in text.split("\r\n\r\n") if f]
    assert all(f.startswith("data: ") and "\n" not in f for f in frames), frames  # Gemini CLI's parser
    return [json.loads(f[len("data: "):]) for f in frames]


def upstream_bodies(gateway: RunningGateway) -> list[dict[str, Any]]:
    return [r["body"] for r in gateway.fake.requests if r.get("path", "").startswith("/v1beta/")]


def assert_paired(body: dict[str, Any]) -> None:
    """Every functionCall turn is followed by a user turn answering each call, in order, and only those."""
    contents = body["contents"]
    for index, content in enumerate(contents):
        calls = [p["functionCall"] for p in content["parts"] if "functionCall" in p]
        if content["role"] == "model" and calls:
            answers = [p["functionResponse"] for p in contents[index + 1]["parts"] if "functionResponse" in p]
            assert [(a["name"], a.get("id")) for a in answers] == [(c["name"], c.get("id")) for c in calls], index
        if content["role"] == "user" and any("functionResponse" in p for p in content["parts"]):
            assert index and any("functionCall" in p for p in contents[index - 1]["parts"]), index


def test_generate_content_answers_in_googles_shape(gateway: RunningGateway) -> None:
    gateway.fake.script(message={"role": "assistant", "content": "Hello from Gemini."})
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "systemInstruction": SYSTEM,
            "generationConfig": {"temperature": 1, "thinkingConfig": {"thinkingBudget": 8192}},
            "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}]}
    answer = post(gateway, body)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["candidates"][0]["content"] == {"role": "model", "parts": [{"text": "Hello from Gemini."}]}
    assert data["candidates"][0]["finishReason"] == "STOP" and data["usageMetadata"]["promptTokenCount"] > 0
    request = gateway.fake.requests[-1]
    assert request["path"] == f"/v1beta/models/{MODEL}:generateContent"
    assert request["headers"]["x-goog-api-key"] == "upstream-key"  # the deployment's key, never the tenant's
    sent = request["body"]
    for field in ("systemInstruction", "generationConfig", "safetySettings"):
        assert sent[field] == body[field]  # passed on as the client sent them
    with gateway.client() as http:
        run = http.get(f"/api/requests/{answer.headers['x-gateway-request-id']}").json()
    assert run["wire_format"] == "google.gemini" and run["status"] == "ok"


@pytest.mark.parametrize("query", ["?alt=sse", ""])
def test_streams_as_server_sent_events_or_as_a_json_array(gateway: RunningGateway, query: str) -> None:
    gateway.fake.script(message={"role": "assistant", "content": "A streamed answer in two pieces."})
    answer = post(gateway, {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}, "streamGenerateContent",
                  query)
    assert answer.status_code == 200, answer.text
    if query:
        assert answer.headers["content-type"].startswith("text/event-stream")
        chunks = sse_chunks(answer.text)
    else:
        assert answer.headers["content-type"].startswith("application/json")
        chunks = json.loads(answer.text)
    text = "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"])
    assert text == "A streamed answer in two pieces."
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP" and chunks[-1]["usageMetadata"]["totalTokenCount"]
    assert all("finishReason" not in c["candidates"][0] for c in chunks[:-1])


def test_the_key_comes_as_googles_header_a_query_parameter_or_a_bearer(gateway: RunningGateway) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        url = f"/v1beta/models/{MODEL}:generateContent"
        assert http.post(url, json=body, params={"key": TENANT_KEY}).status_code == 200
        assert http.post(url, json=body, headers={"authorization": f"Bearer {TENANT_KEY}"}).status_code == 200
        stable = http.post(f"/v1/models/{MODEL}:generateContent", json=body, params={"key": TENANT_KEY})
        assert stable.status_code == 200
        missing = http.post(url, json=body)
        assert missing.status_code == 401
        assert missing.json()["error"]["status"] == "UNAUTHENTICATED" and "x-goog-api-key" in missing.text
        wrong = http.post(url, json=body, params={"key": "sk-nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == 401
        # ?key= is Google's: OpenAI's routes do not read it
        assert http.post("/v1/chat/completions", params={"key": TENANT_KEY},
                         json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]}).status_code == 401


@pytest.mark.parametrize(("path", "status", "name"), [
    (f"/v1beta/models/{MODEL}:embedContent", 404, "NOT_FOUND"),
    ("/v1beta/models/no-such-model:generateContent", 404, "NOT_FOUND"),
    ("/v1beta/models/gemini-..%2F..%2Fx:generateContent", 404, "NOT_FOUND"),
    (f"/v1beta/models/{MODEL}:streamGenerateContent?alt=proto", 400, "INVALID_ARGUMENT"),
])
def test_bad_paths_are_googles_errors(gateway: RunningGateway, path: str, status: int, name: str) -> None:
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        answer = http.post(path, json={"contents": [{"role": "user", "parts": [{"text": "x"}]}]},
                           headers={"x-goog-api-key": TENANT_KEY})
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["status"] == name and answer.json()["error"]["code"] == status
    assert len(gateway.fake.requests) == 0


def test_a_tenant_limited_to_other_models_gets_not_found(gateway: RunningGateway) -> None:
    answer = post(gateway, {"contents": [{"role": "user", "parts": [{"text": "x"}]}]}, key=OTHER_TENANT_KEY)
    assert answer.status_code == 404 and answer.json()["error"]["status"] == "NOT_FOUND"


def test_upstream_errors_reach_the_client_in_googles_shape(gateway: RunningGateway) -> None:
    gateway.fake.script(status=429, error={"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"})
    answer = post(gateway, {"contents": [{"role": "user", "parts": [{"text": "x"}]}]}, "streamGenerateContent",
                  "?alt=sse")
    assert answer.status_code == 429 and answer.json()["error"]["status"] == "RESOURCE_EXHAUSTED"


def test_a_broken_stream_ends_with_an_error_chunk_and_a_recorded_failure(gateway: RunningGateway) -> None:
    gateway.fake.script(message={"role": "assistant", "content": "This answer will not finish in time."},
                        break_stream_after=1)
    answer = post(gateway, {"contents": [{"role": "user", "parts": [{"text": "x"}]}]}, "streamGenerateContent",
                  "?alt=sse")
    chunks = sse_chunks(answer.text)
    assert "error" in chunks[-1] and chunks[-1]["error"]["code"] >= 500
    with gateway.client() as http:
        run = http.get(f"/api/requests/{answer.headers['x-gateway-request-id']}").json()
    assert run["status"] == "error"


def test_count_tokens_and_the_model_list(gateway: RunningGateway) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "count me " * 50}]}]}
    counted = post(gateway, body, "countTokens")
    assert counted.status_code == 200 and counted.json()["totalTokens"] > 50
    with httpx.Client(base_url=gateway.url, timeout=60, headers={"x-goog-api-key": TENANT_KEY}) as http:
        listed = http.get("/v1beta/models").json()["models"]
        assert {"models/gemini-*", "models/fake"} <= {m["name"] for m in listed}
        one = http.get(f"/v1beta/models/{MODEL}")
        assert one.status_code == 200 and one.json()["name"] == f"models/{MODEL}"
        assert http.get("/v1beta/models/claude-x").json()["error"]["status"] == "NOT_FOUND"


def _read_loop(gateway: RunningGateway, files: dict[str, str], query: str) -> list[dict]:
    """Gemini CLI's loop: each answer's functionCall is run and its result sent back, ids as the CLI makes them."""
    contents: list[dict] = [{"role": "user", "parts": [{"text": "Read every module."}]}]
    method = "streamGenerateContent" if query else "generateContent"
    for number, path in enumerate(files):
        gateway.fake.script(parts=[{"text": f"Reading {path}."},
                                   {"functionCall": {"name": "read_file", "args": {"file_path": path}},
                                    "thoughtSignature": f"sig-{number}"}])
        answer = post(gateway, {"contents": contents, "systemInstruction": SYSTEM, "tools": TOOLS}, method, query)
        assert answer.status_code == 200, answer.text
        chunks = sse_chunks(answer.text) if query else [answer.json()]
        parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"] if p != {"text": ""}]
        call = next(p for p in parts if "functionCall" in p)
        assert call["thoughtSignature"] == f"sig-{number}"  # forwarded untouched
        call = {"functionCall": {"id": f"read_file_{number}", **call["functionCall"]},
                "thoughtSignature": call["thoughtSignature"]}
        contents.append({"role": "model", "parts": [p for p in parts if "functionCall" not in p] + [call]})
        contents.append({"role": "user", "parts": [{"functionResponse": {
            "name": "read_file", "response": {"output": files[path]}, "id": f"read_file_{number}"}}]})
    return contents


@pytest.mark.parametrize("query", ["", "?alt=sse"])
def test_a_tool_loop_is_captured_and_old_results_become_memories(gateway: RunningGateway, query: str) -> None:
    files = {f"src/mod{i}.py": f"# module {i}\n{FILE}" for i in range(4)}
    contents = _read_loop(gateway, files, query)
    gateway.fake.script(message={"role": "assistant", "content": "All read."})
    final = post(gateway, {"contents": contents, "systemInstruction": SYSTEM, "tools": TOOLS})
    assert final.status_code == 200
    bodies = upstream_bodies(gateway)
    for body in bodies:
        assert_paired(body)
    results = [p["functionResponse"] for c in bodies[-1]["contents"] for p in c["parts"] if "functionResponse" in p]
    assert results[-1]["response"] == {"output": files["src/mod3.py"]}  # the latest round verbatim
    for old in results[:-1]:
        assert "compacted artifact:art_" in old["response"]["output"] and len(old["response"]["output"]) < 1000
    calls = [p for c in bodies[-1]["contents"] for p in c["parts"] if "functionCall" in p]
    assert [c["thoughtSignature"] for c in calls] == [f"sig-{n}" for n in range(4)]
    from gateway.wire.gemini import to_neutral
    path = message_path("acme", to_neutral(SYSTEM, contents)[0])
    tool_nodes = [n for n in path if n.message.get("role") == "tool"]
    assert len(tool_nodes) == 4
    with gateway.client() as http, gateway.client(key=OTHER_TENANT_KEY) as other:
        for node, content in zip(tool_nodes, files.values()):
            artifact = artifact_id_for(node.id)
            assert http.get(f"/api/artifacts/{artifact}").content == content.encode()  # byte-exact
            assert other.get(f"/api/artifacts/{artifact}").status_code == 404


@pytest.mark.parametrize("query", ["", "?alt=sse"])
def test_rehydration_is_answered_inside_the_gateway(gateway: RunningGateway, query: str) -> None:
    files = {f"src/mod{i}.py": f"SECRET-{i}\n{FILE}" for i in range(3)}
    contents = _read_loop(gateway, files, "")
    bodies = upstream_bodies(gateway)
    declared = [d["name"] for t in bodies[-1]["tools"] for d in t["functionDeclarations"]]
    assert declared == ["read_file", "gateway_rehydrate"]
    memory = next(p["functionResponse"]["response"]["output"] for c in bodies[-1]["contents"] for p in c["parts"]
                  if "functionResponse" in p)
    artifact = memory.split("compacted artifact:")[1].split()[0].rstrip(".,;)")
    gateway.fake.reset()
    gateway.fake.script(parts=[{"text": "Let me fetch it."},
                               {"functionCall": {"name": "gateway_rehydrate", "args": {"artifact_id": artifact}},
                                "thoughtSignature": "sig-gw"}],
                        usage={"promptTokenCount": 100, "candidatesTokenCount": 10, "totalTokenCount": 110})
    gateway.fake.script(message={"role": "assistant", "content": "Line 0 says SECRET-0."},
                        usage={"promptTokenCount": 300, "candidatesTokenCount": 12, "totalTokenCount": 312})
    method = "streamGenerateContent" if query else "generateContent"
    answer = post(gateway, {"contents": contents, "systemInstruction": SYSTEM, "tools": TOOLS}, method, query)
    assert answer.status_code == 200, answer.text
    chunks = sse_chunks(answer.text) if query else [answer.json()]
    text = "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"])
    assert text.endswith("Line 0 says SECRET-0.") and "gateway_rehydrate" not in answer.text
    assert chunks[-1]["usageMetadata"]["promptTokenCount"] == 400
    assert chunks[-1]["usageMetadata"]["candidatesTokenCount"] == 22
    first, second = upstream_bodies(gateway)
    hidden_call, hidden_answer = second["contents"][-2], second["contents"][-1]
    assert hidden_call["parts"][-1]["thoughtSignature"] == "sig-gw"  # the model's own part, as it came
    assert hidden_answer == {"role": "user", "parts": [{"functionResponse": {
        "name": "gateway_rehydrate", "response": {"output": files["src/mod0.py"]}}}]}  # the exact bytes
    assert_paired(second)


def test_the_providers_cache_reads_are_recorded(gateway: RunningGateway) -> None:
    """The projection's prefix (tools, system instruction, the first turns) stays byte-stable between
    requests, so Gemini's implicit cache (the fake's: the longest prefix an earlier request began with)
    keeps hitting, and the run records the cached tokens Google reports."""
    files = {f"src/mod{i}.py": f"# module {i}\n{FILE}" for i in range(3)}
    _read_loop(gateway, files, "?alt=sse")
    reported = [r for r in gateway.fake.requests if r.get("path", "").startswith("/v1beta/")]
    with gateway.client() as http:
        runs = [http.get(f"/api/requests/{r['headers']['x-client-request-id']}").json() for r in reported]
    cached = [run["usage"]["cached_tokens"] for run in runs]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
    bodies = upstream_bodies(gateway)
    for before, after in zip(bodies, bodies[1:]):
        assert after["tools"] == before["tools"] and after["systemInstruction"] == before["systemInstruction"]
        kept = min(2, len(before["contents"]))
        assert after["contents"][:kept] == before["contents"][:kept]  # the prompt and the first call, as before


def test_a_gemini_client_reaches_an_openai_deployment_through_litellms_translation(gateway: RunningGateway) -> None:
    gateway.fake.script(message={"role": "assistant", "content": "Translated."})
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "systemInstruction": SYSTEM,
            "generationConfig": {"temperature": 0.2, "maxOutputTokens": 64}}
    answer = post(gateway, body, model="fake")
    assert answer.status_code == 200, answer.text
    assert answer.json()["candidates"][0]["content"]["parts"] == [{"text": "Translated."}]
    sent = gateway.fake.requests[-1]["body"]  # a chat completion, from LiteLLM's adapter
    assert sent["messages"][0] == {"role": "system", "content": "You are a coding agent."}
    assert sent["temperature"] == 0.2 and sent["max_tokens"] == 64
    gateway.fake.script(message={"role": "assistant", "content": "Streamed through the adapter."})
    streamed = post(gateway, body, "streamGenerateContent", "?alt=sse", model="fake")
    text = "".join(p.get("text", "") for c in sse_chunks(streamed.text) for p in c["candidates"][0]["content"]["parts"])
    assert text == "Streamed through the adapter."
    refused = post(gateway, {**body, "cachedContent": "cachedContents/abc"}, model="fake")
    assert refused.status_code == 400 and "cachedContent" in refused.json()["error"]["message"]
