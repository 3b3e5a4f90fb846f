"""The Anthropic Messages API through the gateway, driven by the real `anthropic` SDK.

The upstream is the fake's `/v1/messages` (gateway/fake_upstream/messages.py) reached
through LiteLLM's Messages API, the way a deployment with
`litellm_params.model: anthropic/...` is.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import pytest
import yaml

from gateway.fake_upstream.messages import cache_usage
from gateway.pipeline.rehydration import DESCRIPTION, PARAMETERS
from gateway.pipeline.tool_additions import BETAS, addition_message
from policies.transcript import artifact_id_for, message_path
from testkit.gateway import OTHER_TENANT_KEY, TENANT_KEY, RunningGateway, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream

MODEL = "claude-sonnet-4-5"
EAGER = {"name": "eager", "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 0, "clear_at_least_tokens": 0,
                                         "min_tokens": 50, "horizon": 1000}}
READ_TOOL = {"name": "Read", "description": "Read a file", "input_schema": {
    "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}
FILE = "\n".join(f"{i:4d}  def function_{i}(argument): return argument * {i}  # line of source" for i in range(150))


@pytest.fixture
def gateway(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    yield from anthropic_gateway(fake, storage_url, tmp_path)


def anthropic_gateway(fake: FakeUpstream, storage_url: str, tmp_path: Path,
                      policy: dict[str, Any] = EAGER) -> Iterator[RunningGateway]:
    """A gateway with claude-* routed to the fake's Messages API (and `fake` to its Chat API), tenant
    acme on `policy` (an eager one by default)."""
    (tmp_path / "eager.yaml").write_text(yaml.safe_dump(policy))
    models = [{"name": "claude-*", "litellm_params": {"model": "anthropic/claude-*", "api_base": fake.url,
                                                       "api_key": "sk-upstream"}},
              {"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": fake.api_base,
                                                   "api_key": "sk-upstream"}}]
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "eager.yaml"},
               {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "policy": "default", "models": ["claude-*"]}]
    settings = settings_for(fake.api_base, storage_url, tmp_path, models=models, tenants=tenants)
    running, server = start_gateway(settings, fake)
    yield running
    server.stop()


def client(gateway: RunningGateway, key: str = TENANT_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0)


def record(gateway: RunningGateway, request_id: str) -> dict[str, Any]:
    with gateway.client() as http:
        return http.get(f"/api/requests/{request_id}").json()


def upstream_messages(gateway: RunningGateway) -> list[dict[str, Any]]:
    return [r["body"] for r in gateway.fake.requests if r.get("path") == "/v1/messages"]


def assert_valid_anthropic_request(body: dict[str, Any]) -> None:
    """Every tool_use is answered by a tool_result at the start of the next user turn, and only there."""
    messages = body["messages"]
    for index, message in enumerate(messages):
        blocks = message["content"] if isinstance(message["content"], list) else []
        uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        if message["role"] == "assistant" and uses:
            following = messages[index + 1]["content"] if index + 1 < len(messages) else []
            results = [b["tool_use_id"] for b in following if isinstance(b, dict) and b.get("type") == "tool_result"]
            assert sorted(results) == sorted(uses), (index, uses, results)
            kinds = [b.get("type") for b in following]
            assert kinds[: len(results)] == ["tool_result"] * len(results)
        if message["role"] == "user" and index and isinstance(message["content"], list):
            previous = messages[index - 1]["content"]
            asked = {b["id"] for b in previous if isinstance(b, dict) and b.get("type") == "tool_use"} \
                if isinstance(previous, list) else set()
            for block in message["content"]:
                if block.get("type") == "tool_result":
                    assert block["tool_use_id"] in asked


def test_create_forwards_the_request_and_answers_in_anthropics_shape(gateway: RunningGateway) -> None:
    gateway.fake.script(blocks=[{"type": "text", "text": "Hello from the model"}])
    system = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
    response = client(gateway).messages.with_raw_response.create(
        model=MODEL, max_tokens=64, system=system, messages=[{"role": "user", "content": "hi"}],
        metadata={"user_id": "user-7"}, stop_sequences=["END"], extra_body={"top_k": 5, "temperature": 0.2},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})
    message = response.parse()
    assert message.content[0].text == "Hello from the model" and message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 7
    upstream = gateway.fake.requests[-1]
    body = upstream["body"]
    assert body["model"] == MODEL and body["system"] == system  # the client's system prompt, markers kept
    assert (body["metadata"], body["stop_sequences"], body["top_k"], body["temperature"]) == (
        {"user_id": "user-7"}, ["END"], 5, 0.2)
    assert upstream["headers"]["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert upstream["headers"]["anthropic-version"]
    run = record(gateway, response.headers["x-gateway-request-id"])
    assert run["status"] == "ok" and run["wire_format"] == "anthropic.messages"
    assert run["finish_reason"] == "end_turn" and run["usage"]["completion_tokens"] == 7
    assert run["upstream_model"] == f"anthropic/{MODEL}"  # the wildcard entry's model, filled in


def test_streaming_follows_anthropics_event_sequence(gateway: RunningGateway) -> None:
    gateway.fake.script(blocks=[{"type": "thinking", "thinking": "Let me look.", "signature": "c2lnbmF0dXJl"},
                                {"type": "text", "text": "I will read the file."},
                                {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "a.py"}}])
    with client(gateway).messages.stream(model=MODEL, max_tokens=64, tools=[READ_TOOL],
                                         messages=[{"role": "user", "content": "read a.py"}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[0].signature == "c2lnbmF0dXJl" and final.content[2].input == {"file_path": "a.py"}
    assert final.stop_reason == "tool_use"
    with httpx.Client(base_url=gateway.url, headers={"x-api-key": TENANT_KEY}) as http:
        gateway.fake.script(blocks=[{"type": "text", "text": "plain"}])
        raw = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 8, "stream": True,
                                              "messages": [{"role": "user", "content": "x"}]}).text
    names = [line[7:] for line in raw.split("\n") if line.startswith("event: ")]
    assert names == ["message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]


def agent_turn(gateway: RunningGateway, messages: list[dict], stream: bool = False) -> Any:
    sdk = client(gateway)
    kwargs = {"model": MODEL, "max_tokens": 256, "tools": [READ_TOOL], "messages": messages,
              "system": "You are a coding agent."}
    if stream:
        with sdk.messages.stream(**kwargs) as live:
            return live.get_final_message()
    return sdk.messages.create(**kwargs)


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_loop_is_captured_and_old_results_become_memories(gateway: RunningGateway, stream: bool) -> None:
    files = {f"src/mod{i}.py": f"# module {i}\n{FILE}" for i in range(4)}
    messages: list[dict] = [{"role": "user", "content": "Read every module."}]
    for number, path in enumerate(files):
        gateway.fake.script(blocks=[{"type": "text", "text": f"Reading {path}."},
                                    {"type": "tool_use", "id": f"toolu_{number}", "name": "Read",
                                     "input": {"file_path": path}}])
        reply = agent_turn(gateway, messages, stream)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{number}", "content": files[path]}]})
    gateway.fake.script(blocks=[{"type": "text", "text": "All read."}])
    agent_turn(gateway, messages, stream)
    bodies = upstream_messages(gateway)
    for body in bodies:
        assert_valid_anthropic_request(body)
    last = bodies[-1]["messages"]
    results = [b for m in last if isinstance(m["content"], list) for b in m["content"] if b["type"] == "tool_result"]
    assert results[-1]["content"] == files["src/mod3.py"]  # the latest round verbatim
    for old in results[:-1]:
        assert "compacted artifact:art_" in old["content"] and len(old["content"]) < 1000
    # Every file is an artifact, byte-exact, served to its tenant only.
    path = message_path("acme", [{"role": "system", "content": "You are a coding agent."},
                                 *_neutral_for(messages)])
    tool_nodes = [n for n in path if n.message.get("role") == "tool"]
    assert len(tool_nodes) == 4
    with gateway.client() as http, gateway.client(key=OTHER_TENANT_KEY) as other:
        for node, content in zip(tool_nodes, files.values()):
            artifact = artifact_id_for(node.id)
            assert http.get(f"/api/artifacts/{artifact}").content == content.encode()
            assert other.get(f"/api/artifacts/{artifact}").status_code == 404


def _neutral_for(messages: list[dict]) -> list[dict]:
    from gateway.wire.anthropic_messages import to_neutral

    return to_neutral(None, messages)[0]


def test_thinking_blocks_travel_byte_identical(gateway: RunningGateway) -> None:
    thinking = {"type": "thinking", "thinking": "The user wants the file; Read it first. ünïcödé ✓",
                "signature": "EqQBCkYIBRgCIkDsignature+/=="}
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr"}
    gateway.fake.script(blocks=[thinking, redacted, {"type": "tool_use", "id": "toolu_t", "name": "Read",
                                                     "input": {"file_path": "a.py"}}])
    messages: list[dict] = [{"role": "user", "content": "read a.py"}]
    reply = agent_turn(gateway, messages)
    assistant = {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
    assert assistant["content"][0] == thinking and assistant["content"][1] == redacted
    messages += [assistant, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_t",
                                                           "content": FILE}]}]
    for turn in range(3):
        gateway.fake.script(blocks=[{"type": "text", "text": f"turn {turn}"}])
        agent_turn(gateway, messages)
        messages += [{"role": "assistant", "content": [{"type": "text", "text": f"turn {turn}"}]},
                     {"role": "user", "content": f"go on {turn}"}]
        forwarded = upstream_messages(gateway)[-1]["messages"][1]["content"]
        assert json.dumps(forwarded[:2]) == json.dumps(assistant["content"][:2])  # as the client sent them


def test_count_tokens_counts_what_would_be_forwarded(gateway: RunningGateway) -> None:
    messages = [{"role": "user", "content": "hello there, count me"}]
    counted = client(gateway).messages.count_tokens(model=MODEL, messages=messages, tools=[READ_TOOL])
    assert counted.input_tokens > 5
    alone = client(gateway).messages.count_tokens(model=MODEL, messages=messages)
    assert alone.input_tokens < counted.input_tokens  # the tools count too
    assert upstream_messages(gateway) == []  # answered here, nothing stored or forwarded
    assert gateway.store.count_artifacts() == 0


@pytest.mark.parametrize("make, status, kind", [
    (lambda gw: client(gw, "sk-wrong").messages.create(model=MODEL, max_tokens=5,
                                                      messages=[{"role": "user", "content": "x"}]),
     401, "authentication_error"),
    (lambda gw: client(gw).messages.create(model="gpt-4o", max_tokens=5, messages=[{"role": "user", "content": "x"}]),
     404, "not_found_error"),
    (lambda gw: client(gw).messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]), 400, "invalid_request_error"),
    (lambda gw: client(gw).messages.create(model=MODEL, max_tokens=5, messages=[
        {"role": "user", "content": [{"type": "text", "text": 5}]}]), 400, "invalid_request_error"),
])
def test_errors_in_anthropics_shape(gateway: RunningGateway, make: Any, status: int, kind: str) -> None:
    with pytest.raises(anthropic.APIStatusError) as raised:
        make(gateway)
    assert raised.value.status_code == status
    assert raised.value.body["type"] == "error" and raised.value.body["error"]["type"] == kind
    assert raised.value.body["error"]["message"]


def test_malformed_bodies_and_upstream_errors_keep_the_shape(gateway: RunningGateway) -> None:
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {TENANT_KEY}"}) as http:
        for raw in (b"{not json", b'{"model": "claude-x", "messages": [{"role": "user", "content": "x"}]}',
                    b'{"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "\\ud800"}]}'):
            response = http.post("/v1/messages", content=raw)
            assert response.status_code == 400
            assert response.json()["error"]["type"] == "invalid_request_error"
        gateway.fake.script(status=429, error={"type": "rate_limit_error", "message": "slow down"},
                            headers={"retry-after": "7"})
        limited = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 5,
                                                  "messages": [{"role": "user", "content": "x"}]})
        assert limited.status_code == 429 and limited.json()["error"]["type"] == "rate_limit_error"
        assert limited.headers["retry-after"] == "7"


def test_the_claude_code_session_header_names_the_conversation(gateway: RunningGateway) -> None:
    gateway.fake.script(blocks=[{"type": "text", "text": "ok"}])
    response = client(gateway).messages.with_raw_response.create(
        model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}],
        extra_headers={"x-claude-code-session-id": "cc-session-42"})
    run = record(gateway, response.headers["x-gateway-request-id"])
    assert run["session_label"] == "cc-session-42"
    with gateway.client() as http:
        assert {s["session"] for s in http.get("/api/savings").json()["by_session"]} == {"cc-session-42"}


def test_tool_results_keep_their_error_flag_and_structure(gateway: RunningGateway) -> None:
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash",
                                                   "input": {"command": "false"}},
                                                  {"type": "tool_use", "id": "t2", "name": "Read",
                                                   "input": {"file_path": "b"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "exit 1", "is_error": True},
                    {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "b body"}]},
                    {"type": "text", "text": "what now?"}]}]
    gateway.fake.script(blocks=[{"type": "text", "text": "ok"}])
    response = client(gateway).messages.with_raw_response.create(model=MODEL, max_tokens=5, messages=messages)
    run = record(gateway, response.headers["x-gateway-request-id"])
    by_call = {a["tool_call_id"]: a for a in run["captured_artifacts"]}
    assert by_call["t1"]["status"] == "error" and by_call["t2"]["status"] == "ok"
    with gateway.client() as http:
        structured = http.get(f"/api/artifacts/{by_call['t2']['id']}")
    assert json.loads(structured.content) == [{"type": "text", "text": "b body"}]
    forwarded = upstream_messages(gateway)[-1]["messages"]
    assert forwarded[-1]["content"][-1].pop("cache_control") == {"type": "ephemeral"}  # the gateway's marker
    assert forwarded == messages  # otherwise forwarded as sent


def read_turns(gateway: RunningGateway, count: int, label: str = "FILE") -> list[dict[str, Any]]:
    """An agent reading `count` files, one per turn (file n holds `{label}-{n}` and FILE); the conversation."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the files."}]
    for number in range(count):
        gateway.fake.script(blocks=[{"type": "tool_use", "id": f"toolu_{number}", "name": "Read",
                                     "input": {"file_path": f"f{number}.py"}}])
        reply = agent_turn(gateway, messages)
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{number}",
                                                   "content": f"{label}-{number}\n{FILE}"}]}]
    return messages


def _two_reads(gateway: RunningGateway) -> tuple[list[dict], str]:
    """A conversation whose first file is compacted by now; returns it and that file's artifact id."""
    messages = read_turns(gateway, 2, "SECRET")
    gateway.fake.script(blocks=[{"type": "text", "text": "read"}])
    agent_turn(gateway, messages)
    first = upstream_messages(gateway)[-1]["messages"][2]["content"][0]["content"]
    assert "compacted artifact:" in first
    artifact = first.split("artifact:")[1].split(";")[0]
    messages += [{"role": "assistant", "content": [{"type": "text", "text": "read"}]},
                 {"role": "user", "content": "What exactly is on line 0 of f0.py?"}]
    return messages, artifact


def test_what_the_next_move_rewrites_is_not_written_to_the_cache(gateway: RunningGateway) -> None:
    """Once the model keeps answering tool results with calls, the latest result (which the next request
    compacts) is left after the last cache marker: written to the cache it would cost 1.25x for tokens no
    request reads. The next request reads everything the previous one cached, the assistant turn that
    asked for that result included."""
    read_turns(gateway, 6)
    bodies = upstream_messages(gateway)
    written: set[str] = set()
    usages = [cache_usage(body, written) for body in bodies]
    assert len(bodies) == 6
    for number, body in enumerate(bodies[1:], start=1):  # the first holds the user's message alone
        last, asked = body["messages"][-1], body["messages"][-2]
        marked = "cache_control" in last["content"][-1]
        # three answers to results, all calls, before the model is trusted to answer with another
        assert marked == (number < 4), number
        if not marked:
            assert last["content"][-1]["type"] == "tool_result" and "cache_control" in asked["content"][-1]
            assert usages[number]["input_tokens"] > 0  # the latest result, uncached
    # request 5 compacts the result request 4 left uncached, and reads all that request 4 read or wrote
    assert usages[5]["cache_read_input_tokens"] == usages[4]["cache_read_input_tokens"] + usages[4][
        "cache_creation_input_tokens"]
    assert "compacted artifact:" in json.dumps(bodies[5]["messages"][-3])


@pytest.mark.parametrize("stream", [False, True])
def test_rehydration_is_answered_inside_the_gateway(gateway: RunningGateway, stream: bool) -> None:
    messages, artifact = _two_reads(gateway)
    gateway.fake.reset()
    gateway.fake.script(blocks=[{"type": "text", "text": "Let me fetch it."},
                                {"type": "tool_use", "id": "toolu_gw", "name": "gateway_rehydrate",
                                 "input": {"artifact_id": artifact}}],
                        usage={"input_tokens": 100, "output_tokens": 10})
    gateway.fake.script(blocks=[{"type": "text", "text": "Line 0 says SECRET-0."}],
                        usage={"input_tokens": 300, "output_tokens": 12})
    final = agent_turn(gateway, messages, stream)
    assert [b.type for b in final.content] == ["text", "text"] or [b.type for b in final.content] == ["text"]
    assert final.content[-1].text == "Line 0 says SECRET-0." and final.stop_reason == "end_turn"
    assert "gateway_rehydrate" not in final.model_dump_json()
    assert final.usage.output_tokens == 22 and final.usage.input_tokens == 400
    first, second = upstream_messages(gateway)
    # the tool is added mid-conversation, right after the first compacted result, not in `tools`
    assert all(t["name"] != "gateway_rehydrate" for t in first["tools"])
    added = [m for m in first["messages"] if m["role"] == "system"]
    assert added == [addition_message({"name": "gateway_rehydrate", "description": DESCRIPTION,
                                       "input_schema": PARAMETERS})]
    at = first["messages"].index(added[0])
    assert "compacted artifact:" in first["messages"][at - 1]["content"][0]["content"]
    betas = [r["headers"]["anthropic-beta"] for r in gateway.fake.requests if r.get("path") == "/v1/messages"]
    assert all(set(BETAS) <= set(b.split(",")) for b in betas)
    answer = second["messages"][-1]["content"][0]
    assert answer["type"] == "tool_result" and answer["tool_use_id"] == "toolu_gw"
    assert answer["content"] == f"SECRET-0\n{FILE}"  # the exact bytes
    assert_valid_anthropic_request(second)
    run = [r for r in gateway.fake.requests if r.get("path") == "/v1/messages"]
    assert len(run) == 2


def test_the_chat_path_reaches_an_anthropic_upstream_too(gateway: RunningGateway) -> None:
    """An OpenAI client's request for a claude-* model goes to the provider's Messages API through LiteLLM."""
    import openai

    gateway.fake.script(blocks=[{"type": "text", "text": "Hello from Messages"}])
    sdk = openai.OpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)
    completion = sdk.chat.completions.create(model=MODEL, max_tokens=32,
                                             messages=[{"role": "system", "content": "Be brief."},
                                                       {"role": "user", "content": "hi"}])
    assert completion.choices[0].message.content == "Hello from Messages"
    upstream = gateway.fake.requests[-1]
    assert upstream["path"] == "/v1/messages" and upstream["body"]["messages"][0]["role"] == "user"
    assert "Be brief." in json.dumps(upstream["body"]["system"])


def test_an_anthropic_client_reaches_an_openai_wire_model_through_litellms_translation(
        gateway: RunningGateway) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "Hello from a Chat model"})
    with httpx.Client(base_url=gateway.url, headers={"x-api-key": TENANT_KEY}) as http:
        response = http.post("/v1/messages", json={"model": "fake", "max_tokens": 32, "system": "Be brief.",
                                                   "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200, response.text
    assert response.json()["content"][0]["text"] == "Hello from a Chat model"
    upstream = gateway.fake.requests[-1]
    assert "path" not in upstream  # the Chat route of the fake
    assert upstream["body"]["messages"][0] == {"role": "system", "content": "Be brief."} or \
        "Be brief." in json.dumps(upstream["body"]["messages"][0])


def test_the_ledger_counts_the_providers_cache_reads_and_writes(gateway: RunningGateway) -> None:
    system = [{"type": "text", "text": "A long and stable system prompt. " * 40, "cache_control": {"type": "ephemeral"}}]
    ids = []
    for turn in range(2):
        gateway.fake.script(blocks=[{"type": "text", "text": f"answer {turn}"}])
        response = client(gateway).messages.with_raw_response.create(
            model=MODEL, max_tokens=16, system=system, messages=[{"role": "user", "content": "same question"}])
        ids.append(response.headers["x-gateway-request-id"])
    first, second = record(gateway, ids[0]), record(gateway, ids[1])
    assert first["usage"]["cache_write_tokens"] > 0 and not first["usage"]["cached_tokens"]
    assert second["usage"]["cached_tokens"] > 0  # read back what the first request wrote
    assert first["cost_usd"] > 0 and second["cost_usd"] < first["cost_usd"]  # priced by LiteLLM's cost map
    with gateway.client() as http:
        totals = http.get("/api/savings").json()["totals"]
    assert totals["cached_tokens"] == second["usage"]["cached_tokens"]
    assert totals["cache_write_tokens"] == first["usage"]["cache_write_tokens"] + (
        second["usage"]["cache_write_tokens"] or 0)
