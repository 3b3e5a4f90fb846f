"""LangChain's `ChatOpenAI` pointed at the gateway, unchanged, end to end.

The gateway runs on a real socket; the fake upstream plays the model. The
client is ordinary LangChain code (`invoke`, `bind_tools`, `ToolMessage`,
`.stream`, `ainvoke`), so these tests pin the promise of the README: point
an agent framework's `base_url` at the gateway and nothing else changes.

- plain answers and their metadata (usage, model, finish reason);
- tool calling: LangChain parses the scripted call, the test runs the tool
  like an agent loop does, and the gateway holds the result byte-exact
  (found through `x-gateway-request-id`, which `include_response_headers=True`
  or an httpx event hook exposes to a LangChain client);
- parallel calls and a tool returning content blocks (kept as canonical JSON);
- `with_structured_output`, and errors LangChain raises as the OpenAI ones;
- streaming, of text and of a tool call aggregated from chunks;
- the async client;
- a coding-agent conversation long enough that the gateway forwards an early
  tool result as a `[compacted artifact:...]` memory while LangChain still
  holds, and keeps re-sending, the full history; and a `gateway_rehydrate`
  round the LangChain client never sees.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from testkit.gateway import TENANT_KEY, RunningGateway, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream
from policies.transcript import short_ref

# A tool output with what tends to get mangled on the way: non-ASCII, quotes,
# backslashes, tabs, CRLF, trailing spaces and a final newline.
WEATHER_OUTPUT = 'Paris: 21°C, «ensoleillé» ✓\r\n\t"wind": "12 km/h"  \\n not a newline  \n'


@tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    assert city == "Paris"
    return WEATHER_OUTPUT


@tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    return file_content(path)


def file_content(path: str) -> str:
    """A few thousand characters of distinct, deterministic source text per path."""
    lines = [f"# {path}"] + [f"def handler_{i}(request):  # {path} line {i}\n    return {i} * 2 ** {i % 7}"
                             for i in range(60)]
    return "\n".join(lines) + "\n"


def tool_call_message(call_id: str, name: str, **arguments: Any) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def chat(gateway: RunningGateway, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, model="fake", max_retries=0,
                      timeout=30, **kwargs)


def request_id(message: BaseMessage) -> str:
    """The gateway's request id, from the headers `include_response_headers=True` keeps."""
    rid = message.response_metadata["headers"]["x-gateway-request-id"]
    assert rid.startswith("req_")
    return rid


QUESTION = [SystemMessage("You are terse."), HumanMessage("Weather in Paris?")]


# 1. invoke -------------------------------------------------------------------------------------------------

def test_invoke_plain_answer_with_metadata(gateway: RunningGateway) -> None:
    answer = "Sunny in Paris, 21°C — «bonne journée» ✓"
    gateway.fake.script_message({"role": "assistant", "content": answer})
    reply = chat(gateway).invoke(QUESTION)

    assert isinstance(reply, AIMessage) and reply.content == answer
    metadata = reply.response_metadata
    assert metadata["finish_reason"] == "stop"
    assert metadata["model_name"]  # the model as the gateway reports it
    usage = metadata["token_usage"]
    assert usage["completion_tokens"] == 7 and usage["prompt_tokens"] > 0
    assert reply.usage_metadata is not None
    assert reply.usage_metadata["output_tokens"] == 7
    assert reply.usage_metadata["input_tokens"] == usage["prompt_tokens"]
    assert reply.usage_metadata["total_tokens"] == usage["prompt_tokens"] + 7
    # What LangChain sent is what the upstream got.
    assert gateway.fake.last_body()["messages"] == [{"role": "system", "content": "You are terse."},
                                                    {"role": "user", "content": "Weather in Paris?"}]


# 2. bind_tools and an agent-style loop ---------------------------------------------------------------------

def test_bind_tools_agent_loop_captures_tool_result_byte_exact(gateway: RunningGateway) -> None:
    compact = tool_call_message("call_w1", "get_weather", city="Paris")
    compact["tool_calls"][0]["function"]["arguments"] = '{"city":"Paris"}'  # as OpenAI writes them
    gateway.fake.script_message(compact)
    gateway.fake.script_message({"role": "assistant", "content": "It is 21°C and sunny."})
    model = chat(gateway, include_response_headers=True).bind_tools([get_weather])

    messages: list[BaseMessage] = list(QUESTION)
    first = model.invoke(messages)
    assert first.tool_calls == [{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_w1",
                                 "type": "tool_call"}]
    assert gateway.fake.last_body()["tools"][0]["function"]["name"] == "get_weather"
    messages.append(first)
    for call in first.tool_calls:
        result = get_weather.invoke(call)  # a ToolCall in, a ToolMessage out
        assert isinstance(result, ToolMessage) and result.tool_call_id == "call_w1"
        messages.append(result)
    final = model.invoke(messages)
    assert final.content == "It is 21°C and sunny." and not final.tool_calls

    forwarded = gateway.fake.last_body()["messages"]
    assert forwarded[-1] == {"role": "tool", "tool_call_id": "call_w1", "content": WEATHER_OUTPUT}
    assert forwarded[-2]["tool_calls"][0]["function"] == {"name": "get_weather",
                                                          "arguments": json.dumps({"city": "Paris"})}
    with gateway.client() as http:
        first_record = http.get(f"/api/requests/{request_id(first)}").json()
        record = http.get(f"/api/requests/{request_id(final)}").json()
        assert first_record["captured_artifact_ids"] == []
        # one conversation, the first request too: LangChain sends the call back with the arguments it
        # parsed and wrote again (spaced), which is still the model's answer
        assert first_record["conversation_id"] == record["conversation_id"] != request_id(first)
        assert record["status"] == "ok"
        (artifact_id,) = record["captured_artifact_ids"]
        raw = http.get(f"/api/artifacts/{artifact_id}")
        assert raw.status_code == 200 and raw.content == WEATHER_OUTPUT.encode()
        metadata = http.get(f"/api/artifacts/{artifact_id}/metadata").json()
    assert metadata["tool_name"] == "get_weather" and metadata["status"] == "ok"
    assert metadata["bytes"] == len(WEATHER_OUTPUT.encode())
    # The call is linked to the run whose answer asked for it, though LangChain re-sends
    # that answer in its own serialisation.
    asked_by = {c["call_id"]: c["run_id"] for c in gateway.store.iter_tool_calls("acme")}
    assert asked_by == {"call_w1": request_id(first)}


def test_request_id_through_an_httpx_event_hook(gateway: RunningGateway) -> None:
    """Without `include_response_headers`, a plain httpx hook on the client sees every response header."""
    seen: list[str] = []

    def hook(response: httpx.Response) -> None:
        seen.append(response.headers["x-gateway-request-id"])

    gateway.fake.script_message({"role": "assistant", "content": "hooked"})
    with httpx.Client(event_hooks={"response": [hook]}, timeout=30) as http_client:
        reply = chat(gateway, http_client=http_client).invoke(QUESTION)
    assert reply.content == "hooked"
    assert "headers" not in reply.response_metadata
    (rid,) = seen
    with gateway.client() as http:
        record = http.get(f"/api/requests/{rid}").json()
    assert record["response"]["choices"][0]["message"]["content"] == "hooked"


# 3. streaming ----------------------------------------------------------------------------------------------

def test_stream_text_concatenates_to_the_scripted_answer(gateway: RunningGateway) -> None:
    text = "A long streamed answer, «with» unicode ✓ and more words. " * 6
    gateway.fake.script_message({"role": "assistant", "content": text})
    chunks = list(chat(gateway, stream_usage=True).stream(QUESTION))

    assert len(chunks) > 3 and all(isinstance(c, AIMessageChunk) for c in chunks)
    assert "".join(c.content for c in chunks) == text
    whole = sum(chunks[1:], chunks[0])
    assert whole.content == text
    assert whole.usage_metadata is not None and whole.usage_metadata["output_tokens"] == 7
    assert whole.response_metadata.get("finish_reason") == "stop"
    assert gateway.fake.last_body()["stream"] is True


def test_stream_tool_call_aggregates_into_one_call(gateway: RunningGateway) -> None:
    arguments = {"city": "Paris", "note": "a value long enough to be split across several SSE chunks ✓"}
    gateway.fake.script_message(tool_call_message("call_s1", "get_weather", **arguments))
    chunks = list(chat(gateway).bind_tools([get_weather]).stream(QUESTION))

    assert sum(1 for c in chunks if c.tool_call_chunks) > 2  # the arguments really arrived in pieces
    whole = sum(chunks[1:], chunks[0])
    assert isinstance(whole, AIMessageChunk)
    assert whole.tool_calls == [{"name": "get_weather", "args": arguments, "id": "call_s1", "type": "tool_call"}]
    assert whole.response_metadata.get("finish_reason") == "tool_calls"


# 4. async --------------------------------------------------------------------------------------------------

async def test_ainvoke_and_astream(gateway: RunningGateway) -> None:
    model = chat(gateway)
    gateway.fake.script_message({"role": "assistant", "content": "async hello"})
    reply = await model.ainvoke(QUESTION)
    assert reply.content == "async hello" and reply.usage_metadata["output_tokens"] == 7

    gateway.fake.script_message(tool_call_message("call_a1", "get_weather", city="Paris"))
    reply = await model.bind_tools([get_weather]).ainvoke(QUESTION)
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [("get_weather", {"city": "Paris"})]

    gateway.fake.script_message({"role": "assistant", "content": "async streamed hello"})
    parts = [chunk.content async for chunk in model.astream(QUESTION)]
    assert "".join(parts) == "async streamed hello"


# 5. compaction is invisible to LangChain -------------------------------------------------------------------

@pytest.fixture
def coding_gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    """A gateway whose tenant acme runs the coding-agent policy (old tool results become memories)."""
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "coding-agent"}]
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, tenants=tenants), fake)
    yield running
    server.stop()


PATHS = ["src/app.py", "src/models.py", "src/views.py", "src/urls.py", "tests/test_app.py"]


def test_long_conversation_is_compacted_upstream_but_whole_in_langchain(coding_gateway: RunningGateway) -> None:
    gateway = coding_gateway
    for i, path in enumerate(PATHS):
        gateway.fake.script_message(tool_call_message(f"call_{i}", "read_file", path=path))
    gateway.fake.script_message({"role": "assistant", "content": "All five files read; the handlers double."})
    model = chat(gateway, include_response_headers=True).bind_tools([read_file])

    messages: list[BaseMessage] = [SystemMessage("You are a coding agent."), HumanMessage("Review the app.")]
    replies: list[AIMessage] = []
    for _ in range(len(PATHS) + 2):  # a plain LangChain agent loop
        reply = model.invoke(messages)
        replies.append(reply)
        messages.append(reply)
        if not reply.tool_calls:
            break
        messages.extend(read_file.invoke(call) for call in reply.tool_calls)
    assert replies[-1].content == "All five files read; the handlers double."
    assert len(replies) == len(PATHS) + 1

    # LangChain still holds every tool result in full, and re-sent all of them.
    tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.content for m in tool_messages] == [file_content(p) for p in PATHS]
    assert all(len(m.content) > 2500 for m in tool_messages)
    headers = replies[-1].response_metadata["headers"]
    assert int(headers["x-gateway-tokens-forwarded"]) < int(headers["x-gateway-tokens-original"])

    # The upstream got the early results as memories, the latest round verbatim.
    forwarded = {m["tool_call_id"]: m["content"] for m in gateway.fake.last_body()["messages"] if m["role"] == "tool"}
    assert list(forwarded) == [f"call_{i}" for i in range(len(PATHS))]
    first = forwarded["call_0"]
    assert first.startswith("[compacted artifact:art_") and " lines, " in first.split("\n", 1)[0]
    assert len(first) < len(file_content(PATHS[0])) / 2
    assert forwarded[f"call_{len(PATHS) - 1}"] == file_content(PATHS[-1])

    # The memory names an artifact that gives back the exact bytes LangChain holds.
    artifact_id = first.split("artifact:", 1)[1].split(";", 1)[0]
    with gateway.client() as http:
        raw = http.get(f"/api/artifacts/{artifact_id}")
        assert raw.status_code == 200 and raw.content == file_content(PATHS[0]).encode()
        record = http.get(f"/api/requests/{request_id(replies[-1])}").json()
    assert record["assembly"]["policy"]["name"] == "coding-agent"
    # The memory's short reference names one artifact of the path; the records keep its full id.
    (full,) = [a for a in record["path_artifact_ids"] if a.startswith(artifact_id)]
    assert raw.headers["x-artifact-id"] == full and short_ref(full) == artifact_id
    decision = record["assembly"]["decisions"][3]  # system, user, assistant, then the first result
    assert (decision["role"], decision["action"], decision["artifact_id"]) == ("tool", "compacted", full)


def rehydrate_call(artifact_id: str) -> dict:
    return tool_call_message("gw_1", "gateway_rehydrate", artifact_id=artifact_id)


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_rehydration_round_is_invisible_to_langchain(coding_gateway: RunningGateway, stream: bool) -> None:
    """The model asks the gateway for a compacted result back; LangChain sees only the final answer."""
    gateway = coding_gateway
    model = chat(gateway, include_response_headers=True, stream_usage=True).bind_tools([read_file])
    messages: list[BaseMessage] = [SystemMessage("You are a coding agent."), HumanMessage("Review the app.")]
    for i, path in enumerate(PATHS[:3]):
        gateway.fake.script_message(tool_call_message(f"call_{i}", "read_file", path=path))
        reply = model.invoke(messages)
        messages.append(reply)
        messages.extend(read_file.invoke(call) for call in reply.tool_calls)
    gateway.fake.script_message({"role": "assistant", "content": "noted"})
    reply = model.invoke(messages)  # carries call_2's result; call_0's is a memory by now
    with gateway.client() as http:
        record = http.get(f"/api/requests/{request_id(reply)}").json()
    first_artifact = record["path_artifact_ids"][0]
    assert gateway.fake.last_body()["messages"][3]["content"].startswith(f"[compacted artifact:{short_ref(first_artifact)};")

    messages.append(reply)
    messages.append(HumanMessage("Quote src/app.py exactly."))
    gateway.fake.script_message(rehydrate_call(first_artifact))
    gateway.fake.script_message({"role": "assistant", "content": "Here it is."})
    if stream:
        chunks = list(model.stream(messages))
        final = sum(chunks[1:], chunks[0])
    else:
        final = model.invoke(messages)
    assert final.content == "Here it is." and not final.tool_calls
    assert not getattr(final, "tool_call_chunks", None)
    assert final.usage_metadata["output_tokens"] == 14  # both upstream rounds, summed into the run

    asked, answered = gateway.fake.requests[-2:]
    assert asked["body"]["messages"][3]["content"].startswith(f"[compacted artifact:{short_ref(first_artifact)};")
    assert "gateway_rehydrate" in [t["function"]["name"] for t in asked["body"]["tools"]]
    given = answered["body"]["messages"][-1]
    assert given["role"] == "tool" and given["tool_call_id"] == "gw_1"
    assert file_content(PATHS[0]) in given["content"]


# 6. more of what LangChain agents use ----------------------------------------------------------------------

@tool
def forecast(city: str) -> list:
    """A forecast as content blocks."""
    return [{"type": "text", "text": f"{city}: rain ✓"}, {"type": "text", "text": "tomorrow: sun\n"}]


def test_parallel_calls_and_content_block_results(gateway: RunningGateway) -> None:
    calls = [{"id": "call_p1", "type": "function",
              "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}},
             {"id": "call_p2", "type": "function",
              "function": {"name": "forecast", "arguments": json.dumps({"city": "Rome"})}}]
    gateway.fake.script_message({"role": "assistant", "content": "Checking both.", "tool_calls": calls})
    gateway.fake.script_message({"role": "assistant", "content": "Paris 21°C, Rome rain."})
    tools = {t.name: t for t in (get_weather, forecast)}
    model = chat(gateway, include_response_headers=True).bind_tools(list(tools.values()))

    messages: list[BaseMessage] = list(QUESTION)
    first = model.invoke(messages)
    assert first.content == "Checking both."
    assert [(c["id"], c["name"], c["args"]) for c in first.tool_calls] == [
        ("call_p1", "get_weather", {"city": "Paris"}), ("call_p2", "forecast", {"city": "Rome"})]
    messages.append(first)
    messages.extend(tools[call["name"]].invoke(call) for call in first.tool_calls)
    blocks = messages[-1].content
    assert isinstance(blocks, list)  # LangChain sends these as a list of parts
    final = model.invoke(messages)
    assert final.content == "Paris 21°C, Rome rain."
    assert gateway.fake.last_body()["messages"][-1] == {"role": "tool", "tool_call_id": "call_p2", "content": blocks}

    with gateway.client() as http:
        record = http.get(f"/api/requests/{request_id(final)}").json()
        weather_id, forecast_id = record["captured_artifact_ids"]
        assert http.get(f"/api/artifacts/{weather_id}").content == WEATHER_OUTPUT.encode()
        structured = http.get(f"/api/artifacts/{forecast_id}")
    # Structured content is kept as canonical JSON (sorted keys, no whitespace): the same value.
    assert structured.headers["content-type"].startswith("application/json")
    assert json.loads(structured.content) == blocks
    assert structured.content == json.dumps(blocks, sort_keys=True, separators=(",", ":"),
                                            ensure_ascii=False).encode()


class Weather(BaseModel):
    city: str
    celsius: float


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output(gateway: RunningGateway, method: str) -> None:
    if method == "function_calling":
        gateway.fake.script_message(tool_call_message("call_s", "Weather", city="Paris", celsius=21.5))
    else:
        gateway.fake.script_message({"role": "assistant", "content": json.dumps({"city": "Paris", "celsius": 21.5})})
    assert chat(gateway).with_structured_output(Weather, method=method).invoke(QUESTION) == Weather(
        city="Paris", celsius=21.5)
    body = gateway.fake.last_body()
    if method == "function_calling":
        assert body["tool_choice"] == {"type": "function", "function": {"name": "Weather"}}
    else:
        assert body["response_format"]["type"] == "json_schema"
        assert body["response_format"]["json_schema"]["name"] == "Weather"


def test_errors_reach_langchain_as_openai_errors(gateway: RunningGateway) -> None:
    bad_key = ChatOpenAI(base_url=gateway.api_base, api_key="sk-wrong", model="fake", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        bad_key.invoke(QUESTION)
    assert auth.value.status_code == 401
    gateway.fake.script(status=429, headers={"retry-after": "3"})
    with pytest.raises(openai.RateLimitError) as limited:
        chat(gateway).invoke(QUESTION)
    assert limited.value.response.headers["retry-after"] == "3"
    assert limited.value.response.headers["x-gateway-request-id"].startswith("req_")

