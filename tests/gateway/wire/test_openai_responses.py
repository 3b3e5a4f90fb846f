"""The OpenAI Responses API through the gateway, driven by the real `openai` SDK."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import openai
import pytest
import yaml

from testkit.gateway import OTHER_TENANT_KEY, TENANT_KEY, RunningGateway, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream

EAGER = {"name": "eager", "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 0, "clear_at_least_tokens": 0,
                                         "min_tokens": 50, "horizon": 1000}}
SHELL = {"type": "function", "name": "exec_command", "description": "Run a command",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
OUTPUT = "\n".join(f"{i:5d}  build step {i}: compiled module_{i}.o with 0 warnings" for i in range(150))


@pytest.fixture
def gateway(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    (tmp_path / "eager.yaml").write_text(yaml.safe_dump(EAGER))
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "eager.yaml"},
               {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "policy": "default"}]
    running, server = start_gateway(settings_for(fake.api_base, storage_url, tmp_path, tenants=tenants), fake)
    yield running
    server.stop()


def sdk(gateway: RunningGateway, key: str = TENANT_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.api_base, api_key=key, max_retries=0)


def upstream_bodies(gateway: RunningGateway) -> list[dict[str, Any]]:
    return [r["body"] for r in gateway.fake.requests if r.get("path") == "/v1/responses"]


def call(call_id: str, command: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "exec_command",
                                                         "arguments": json.dumps({"cmd": command})}}]}


def collapsed(kinds: list[str]) -> list[str]:
    """Event types with runs of the same type (the deltas) counted once."""
    return [kind for index, kind in enumerate(kinds) if index == 0 or kinds[index - 1] != kind]


def assert_paired(body: dict[str, Any]) -> None:
    """Every call is answered by an output after it, and every output answers a call before it."""
    calls: set[str] = set()
    for item in body["input"]:
        kind = item.get("type")
        if kind in ("function_call", "custom_tool_call"):
            calls.add(item["call_id"])
        elif kind in ("function_call_output", "custom_tool_call_output"):
            assert item["call_id"] in calls, item
            calls.discard(item["call_id"])
    assert not calls, calls


def test_create_and_stream(gateway: RunningGateway) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "Hello from responses"})
    raw = sdk(gateway).responses.with_raw_response.create(
        model="fake", input="hi", instructions="Be brief.", metadata={"run": "7"}, prompt_cache_key="k1",
        include=["reasoning.encrypted_content"], extra_body={"unknown_field": {"x": 1}})
    response = raw.parse()
    assert response.output_text == "Hello from responses"
    request_id = raw.headers["x-gateway-request-id"]
    assert response.id == "resp_" + request_id.removeprefix("req_")
    body = upstream_bodies(gateway)[-1]
    assert body["instructions"] == "Be brief." and body["store"] is False
    assert (body["metadata"], body["prompt_cache_key"], body["include"], body["unknown_field"]) == (
        {"run": "7"}, "k1", ["reasoning.encrypted_content"], {"x": 1})
    with gateway.client() as http:
        run = http.get(f"/api/requests/{request_id}").json()
    assert run["wire_format"] == "openai.responses" and run["status"] == "ok"
    gateway.fake.script_message({"role": "assistant", "content": "streamed answer"})
    with sdk(gateway).responses.stream(model="fake", input=[{"role": "user", "content": "again"}]) as stream:
        events = [event for event in stream]
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert collapsed(kinds) == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == "streamed answer" and final.id.startswith("resp_")


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_loop_is_captured_and_old_outputs_become_memories(gateway: RunningGateway, stream: bool) -> None:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Build all modules."}]
    outputs = {}
    for number in range(4):
        gateway.fake.script_message(call(f"call_{number}", f"make module{number}"))
        if stream:
            with sdk(gateway).responses.stream(model="fake", input=items, tools=[SHELL]) as live:
                kinds = [e.type for e in live]
                response = live.get_final_response()
            assert collapsed(kinds) == [
                "response.created", "response.in_progress", "response.output_item.added",
                "response.function_call_arguments.delta", "response.function_call_arguments.done",
                "response.output_item.done", "response.completed"]
        else:
            response = sdk(gateway).responses.create(model="fake", input=items, tools=[SHELL])
        [function_call] = [o for o in response.output if o.type == "function_call"]
        items.append(function_call.model_dump(exclude_none=True, exclude={"parsed_arguments"}))
        outputs[function_call.call_id] = f"module {number}\n{OUTPUT}"
        items.append({"type": "function_call_output", "call_id": function_call.call_id,
                      "output": outputs[function_call.call_id]})
    gateway.fake.script_message({"role": "assistant", "content": "All built."})
    sdk(gateway).responses.create(model="fake", input=items, tools=[SHELL])
    bodies = upstream_bodies(gateway)
    for body in bodies:
        assert_paired(body)
    forwarded = {i["call_id"]: i["output"] for i in bodies[-1]["input"] if i.get("type") == "function_call_output"}
    assert forwarded["call_3"] == outputs["call_3"]
    artifacts = {}
    for call_id in ("call_0", "call_1", "call_2"):
        assert forwarded[call_id].startswith("[compacted artifact:art_")
        artifacts[call_id] = forwarded[call_id].split("artifact:")[1].split(";")[0]
    with gateway.client() as http, gateway.client(key=OTHER_TENANT_KEY) as other:
        for call_id, artifact in artifacts.items():
            assert http.get(f"/api/artifacts/{artifact}").content == outputs[call_id].encode()
            assert other.get(f"/api/artifacts/{artifact}").status_code == 404


def test_reasoning_and_custom_tool_items_travel_as_they_came(gateway: RunningGateway) -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Plan: patch."}],
                 "encrypted_content": "gAAAAABencrypted+/=="}
    patch = {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_p", "name": "apply_patch",
             "input": "*** Begin Patch\n*** Update File: a.py\n-x\n+y\n*** End Patch"}
    items = [{"role": "user", "content": "fix a.py"}, reasoning, patch,
             {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done!"},
             {"role": "user", "content": "thanks"}]
    gateway.fake.script_message({"role": "assistant", "content": "ok"})
    sdk(gateway).responses.create(model="fake", input=items, include=["reasoning.encrypted_content"])
    assert upstream_bodies(gateway)[-1]["input"] == items


def test_a_previous_response_id_chain_gives_the_upstream_the_full_transcript(gateway: RunningGateway) -> None:
    chain = sdk(gateway)
    previous = None
    full: list[dict[str, Any]] = []
    for turn in range(5):
        gateway.fake.script_message(call(f"call_c{turn}", f"step {turn}"))
        new: list[dict[str, Any]] = [{"role": "user", "content": f"turn {turn}"}] if turn == 0 else []
        if turn:
            new.append({"type": "function_call_output", "call_id": f"call_c{turn - 1}",
                        "output": f"output {turn - 1}\n{OUTPUT}"})
        response = chain.responses.create(model="fake", input=new, tools=[SHELL], previous_response_id=previous,
                                          instructions="You run builds.")
        full += new + [o.model_dump(exclude_none=True, exclude={"parsed_arguments"}) for o in response.output]
        previous = response.id
    chained = upstream_bodies(gateway)[-1]
    # The same transcript sent whole by another conversation of the same tenant is projected alike.
    gateway.fake.script_message({"role": "assistant", "content": "done"})
    whole = full[:-1]  # the last call is still open in the chain's last request
    sdk(gateway).responses.create(model="fake", input=whole, tools=[SHELL], instructions="You run builds.")
    replayed = upstream_bodies(gateway)[-1]
    assert chained["input"] == replayed["input"] and chained["instructions"] == replayed["instructions"]
    assert any(i.get("type") == "function_call_output" and i["output"].startswith("[compacted artifact:")
               for i in chained["input"])


def test_stored_responses_are_the_tenants_own(gateway: RunningGateway) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "stored"})
    response = sdk(gateway).responses.create(model="fake", input="remember this")
    assert sdk(gateway).responses.retrieve(response.id).output_text == "stored"
    with pytest.raises(openai.NotFoundError):
        sdk(gateway, OTHER_TENANT_KEY).responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(gateway, OTHER_TENANT_KEY).responses.create(model="fake", input="x", previous_response_id=response.id)
    assert refused.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError) as other_delete:
        sdk(gateway, OTHER_TENANT_KEY).responses.delete(response.id)
    assert other_delete.value.body["code"] == "response_not_found"
    assert sdk(gateway).responses.retrieve(response.id).output_text == "stored"  # another tenant's delete did nothing
    sdk(gateway).responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        sdk(gateway).responses.retrieve(response.id)
    gateway.fake.script_message({"role": "assistant", "content": "not kept"})
    unstored = sdk(gateway).responses.create(model="fake", input="forget this", store=False)
    with pytest.raises(openai.NotFoundError):
        sdk(gateway).responses.retrieve(unstored.id)


@pytest.mark.parametrize("items, param", [
    ([{"type": "function_call_output", "call_id": "nope", "output": "x"}], "input[0]"),
    ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": 5}], "input[0].arguments"),
    ([{"type": "function_call", "call_id": "c", "name": "n" * 300, "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c", "output": "x"}], "input[0].name"),  # was a 500 on PostgreSQL
    ([{"role": "robot", "content": "x"}], "input[0].role"),
    ([{"role": "user", "content": [{"type": "input_text", "text": 5}]}], "input[0].content[0].text"),
    ("\ud800", None),
])
def test_malformed_input_is_a_400_naming_it(gateway: RunningGateway, items: Any, param: str | None) -> None:
    with gateway.client() as http:
        response = http.post("/v1/responses", content=json.dumps({"model": "fake", "input": items}).encode(),
                             headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param:
        assert error["param"] == param
    assert upstream_bodies(gateway) == []


@pytest.mark.parametrize("stream", [False, True])
def test_rehydration_is_answered_inside_the_gateway(gateway: RunningGateway, stream: bool) -> None:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Build."}]
    for number in range(2):
        gateway.fake.script_message(call(f"call_{number}", f"make {number}"))
        response = sdk(gateway).responses.create(model="fake", input=items, tools=[SHELL])
        items += [o.model_dump(exclude_none=True, exclude={"parsed_arguments"}) for o in response.output]
        items.append({"type": "function_call_output", "call_id": f"call_{number}",
                      "output": f"SECRET-{number}\n{OUTPUT}"})
    gateway.fake.script_message({"role": "assistant", "content": "built"})
    sdk(gateway).responses.create(model="fake", input=items, tools=[SHELL])
    memory = next(i["output"] for i in upstream_bodies(gateway)[-1]["input"]
                  if i.get("call_id") == "call_0" and i.get("type") == "function_call_output")
    artifact = memory.split("artifact:")[1].split(";")[0]
    items += [{"role": "user", "content": "What did step 0 print first?"}]
    gateway.fake.reset()
    gateway.fake.script_message({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_gw", "type": "function",
         "function": {"name": "gateway_rehydrate", "arguments": json.dumps({"artifact_id": artifact})}}]},
        usage={"input_tokens": 100, "output_tokens": 10, "total_tokens": 110})
    gateway.fake.script_message({"role": "assistant", "content": "It printed SECRET-0."},
                                usage={"input_tokens": 300, "output_tokens": 12, "total_tokens": 312})
    if stream:
        with sdk(gateway).responses.stream(model="fake", input=items, tools=[SHELL]) as live:
            events = [e for e in live]
            final = live.get_final_response()
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert "gateway_rehydrate" not in json.dumps([e.model_dump() for e in events])
    else:
        final = sdk(gateway).responses.create(model="fake", input=items, tools=[SHELL])
    assert final.output_text == "It printed SECRET-0."
    assert [o.type for o in final.output] == ["message"]
    assert final.usage.input_tokens == 400 and final.usage.output_tokens == 22
    first, second = upstream_bodies(gateway)
    answer = second["input"][-1]
    assert answer == {"type": "function_call_output", "call_id": "call_gw", "output": f"SECRET-0\n{OUTPUT}"}
    assert_paired(second)


def test_a_provider_without_the_responses_api_is_reached_through_litellms_translation(
        fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> None:
    models = [{"name": "claude-*", "litellm_params": {"model": "anthropic/claude-*", "api_base": fake.url,
                                                       "api_key": "sk-upstream"}}]
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, models=models), fake)
    try:
        fake.script(blocks=[{"type": "text", "text": "Hello through Messages"}])
        response = sdk(running).responses.create(model="claude-sonnet-4-5", input="hi", instructions="Be brief.")
        assert response.output_text == "Hello through Messages"
        upstream = fake.requests[-1]
        assert upstream["path"] == "/v1/messages"
        assert "Be brief." in json.dumps(upstream["body"].get("system"))
    finally:
        server.stop()



def test_a_stream_that_fails_midway_ends_in_a_numbered_error_event(gateway: RunningGateway) -> None:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Build."}]
    for number in range(2):
        gateway.fake.script_message(call(f"call_{number}", f"make {number}"))
        response = sdk(gateway).responses.create(model="fake", input=items, tools=[SHELL])
        items += [o.model_dump(exclude_none=True, exclude={"parsed_arguments"}) for o in response.output]
        items.append({"type": "function_call_output", "call_id": f"call_{number}", "output": f"{number}\n{OUTPUT}"})
    gateway.fake.script_message({"role": "assistant", "content": "built"})
    sdk(gateway).responses.create(model="fake", input=items, tools=[SHELL])
    memory = next(i["output"] for i in upstream_bodies(gateway)[-1]["input"]
                  if i.get("call_id") == "call_0" and i.get("type") == "function_call_output")
    artifact = memory.split("artifact:")[1].split(";")[0]
    # The first round streams (and asks the gateway for the artifact); the round after it fails:
    # the client has had events by then, so the failure is the stream's last event.
    gateway.fake.script_message({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_gw", "type": "function",
         "function": {"name": "gateway_rehydrate", "arguments": json.dumps({"artifact_id": artifact})}}]})
    gateway.fake.script(status=500)
    with gateway.client() as http:
        response = http.post("/v1/responses", json={"model": "fake", "input": items, "tools": [SHELL], "stream": True})
        events = [json.loads(line[len("data: "):]) for line in response.text.splitlines() if line.startswith("data: ")]
        run = http.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "error"
    # numbered after the events before it, as OpenAI numbers every event of a stream
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert run["status"] == "error"
