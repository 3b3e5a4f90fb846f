"""A real multi-turn agent loop through the gateway: the test executes the tools.

The fake upstream plays the model (it asks for tools, then answers); the
agent is ordinary `openai` SDK code that runs each requested tool and sends
the result back, as agents do. Afterwards every tool result the agent
produced must be retrievable byte-exact, linked to the request that first
carried it and to the run whose answer asked for it.
"""
from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
import yaml

from gateway.config import load_settings
from testkit.gateway import TENANT_KEY, RunningGateway, start_gateway
from testkit.fake_upstream import FakeUpstream

REPO = Path(__file__).resolve().parents[3]
FILES = {
    "README.md": "# demo\nA small project.\n",
    "data.csv": "id,name,amount\n1,alpha,10.50\n2,beta,-3\n3,gamma,ünïcode ✓\n",
}
TOOLS = [
    {"type": "function", "function": {"name": "list_files", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]


def run_tool(name: str, arguments: str) -> str:
    args = json.loads(arguments or "{}")
    if name == "list_files":
        return "\n".join(sorted(FILES))
    if name == "read_file":
        return FILES.get(args["path"], f"Error: no such file {args['path']!r}")
    return f"Error: unknown tool {name}"


def call(call_id: str, name: str, **arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


MODEL_SCRIPT = [
    {"role": "assistant", "content": "Let me look around.", "tool_calls": [call("call_a", "list_files")]},
    {"role": "assistant", "content": None, "tool_calls": [call("call_b", "read_file", path="README.md"),
                                                          call("call_c", "read_file", path="data.csv")]},
    {"role": "assistant", "content": None, "tool_calls": [call("call_d", "read_file", path="missing.txt")]},
    {"role": "assistant", "content": "The CSV has 3 rows; missing.txt does not exist."},
]


def agent_loop(client: openai.OpenAI, stream: bool) -> tuple[list[dict], list[str]]:
    messages: list[dict] = [{"role": "system", "content": "You are a file agent."},
                            {"role": "user", "content": "Summarise data.csv"}]
    request_ids = []
    for _ in range(10):
        if stream:
            raw = client.chat.completions.with_raw_response.create(
                model="fake", messages=messages, tools=TOOLS, stream=True)
            content, calls = "", {}
            for chunk in raw.parse():
                delta = chunk.choices[0].delta if chunk.choices else None
                if delta and delta.content:
                    content += delta.content
                for c in (delta.tool_calls or []) if delta else []:
                    slot = calls.setdefault(c.index, {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                    slot["id"] += c.id or ""
                    slot["function"]["name"] += c.function.name or ""
                    slot["function"]["arguments"] += c.function.arguments or ""
            message = {"role": "assistant", "content": content or None}
            if calls:
                message["tool_calls"] = [calls[i] for i in sorted(calls)]
        else:
            raw = client.chat.completions.with_raw_response.create(model="fake", messages=messages, tools=TOOLS)
            message = raw.parse().choices[0].message.model_dump(exclude_none=True)
        request_ids.append(raw.headers["x-gateway-request-id"])
        messages.append(message)
        if not message.get("tool_calls"):
            return messages, request_ids
        for tool_call in message["tool_calls"]:
            result = run_tool(tool_call["function"]["name"], tool_call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": tool_call["id"], "content": result})
    raise AssertionError("the agent did not finish")


@pytest.mark.parametrize("stream", [False, True])
def test_agent_loop_captures_every_tool_result(gateway: RunningGateway, stream: bool) -> None:
    for step in MODEL_SCRIPT:
        gateway.fake.script_message(step)
    client = openai.OpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)
    messages, request_ids = agent_loop(client, stream)
    assert messages[-1]["content"] == MODEL_SCRIPT[-1]["content"]
    assert len(request_ids) == 4
    # What the upstream received is what the agent sent (pass-through projection;
    # LiteLLM leaves out an assistant's `content: null`, which means the same).
    def without_nulls(ms: list[dict]) -> list[dict]:
        return [{k: v for k, v in m.items() if v is not None} for m in ms]

    assert without_nulls(gateway.fake.last_body()["messages"]) == without_nulls(messages[:-1])

    tool_messages = [m for m in messages if m["role"] == "tool"]
    with gateway.client() as http:
        records = [http.get(f"/api/requests/{rid}").json() for rid in request_ids]
        assert [len(r["captured_artifact_ids"]) for r in records] == [0, 1, 2, 1]
        artifact_ids = records[-1]["path_artifact_ids"]
        assert len(artifact_ids) == len(tool_messages) == 4
        for artifact_id, tool_message in zip(artifact_ids, tool_messages):
            assert http.get(f"/api/artifacts/{artifact_id}").content == tool_message["content"].encode()
        statuses = [http.get(f"/api/artifacts/{a}/metadata").json()["status"] for a in artifact_ids]
        assert statuses == ["ok", "ok", "ok", "error"]
    asked_by = {c["call_id"]: c["run_id"] for c in gateway.store.iter_tool_calls("acme")}
    assert asked_by == {"call_a": request_ids[0], "call_b": request_ids[1], "call_c": request_ids[1],
                        "call_d": request_ids[2]}


def test_example_config_with_the_fake_upstream_on_18080(tmp_path: Path) -> None:
    """The issue's setup: config.example.yaml's `fake` model routed to 127.0.0.1:18080."""
    raw = yaml.safe_load((REPO / "config.example.yaml").read_text())
    raw["storage"] = {"url": f"sqlite:///{tmp_path / 'g.db'}", "blob_dir": str(tmp_path / "blobs")}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    settings = load_settings(config)
    assert settings.model("fake").litellm_params["api_base"] == "http://127.0.0.1:18080/v1"
    with FakeUpstream(port=18080) as fake:
        running, server = start_gateway(settings, fake)
        try:
            fake.script_message({"role": "assistant", "content": "from 18080"})
            client = openai.OpenAI(base_url=running.api_base, api_key="sk-acme-1", max_retries=0)
            answer = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}])
            assert answer.choices[0].message.content == "from 18080"
            assert len(fake.requests) == 1
        finally:
            server.stop()
