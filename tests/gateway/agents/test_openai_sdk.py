"""The real `openai` SDK, sync and async, against the gateway and the upstream directly."""
from __future__ import annotations

import json

import openai
import pytest

from testkit.gateway import TENANT_KEY, WEATHER_TOOL, RunningGateway

TOOL_CALL_MESSAGE = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_w1", "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}],
}


def _direct(gateway: RunningGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.fake.api_base, api_key="sk-upstream", max_retries=0)


def _through(gateway: RunningGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)


def _answer(completion: openai.types.chat.ChatCompletion) -> dict:
    choice = completion.choices[0]
    return {
        "content": choice.message.content,
        "tool_calls": [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []],
        "finish_reason": choice.finish_reason,
        "usage": (completion.usage.prompt_tokens, completion.usage.completion_tokens),
    }


def _streamed(stream: openai.Stream) -> dict:
    content, calls, finish, usage = [], {}, None, None
    for chunk in stream:
        if chunk.usage:
            usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        for choice in chunk.choices:
            if choice.delta.content:
                content.append(choice.delta.content)
            for call in choice.delta.tool_calls or []:
                slot = calls.setdefault(call.index, ["", "", ""])
                slot[0] += call.id or ""
                slot[1] += (call.function.name or "") if call.function else ""
                slot[2] += (call.function.arguments or "") if call.function else ""
            finish = choice.finish_reason or finish
    return {"content": "".join(content) or None, "tool_calls": [tuple(calls[i]) for i in sorted(calls)],
            "finish_reason": finish, "usage": usage}


MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}]


@pytest.mark.parametrize("scripted", [
    {"role": "assistant", "content": "It is sunny in Paris, 21°C — «bonne journée» ✓"},
    TOOL_CALL_MESSAGE,
])
def test_sync_answers_match_direct(gateway: RunningGateway, scripted: dict) -> None:
    gateway.fake.script_message(scripted)
    direct = _answer(_direct(gateway).chat.completions.create(model="fake", messages=MESSAGES, tools=[WEATHER_TOOL]))
    gateway.fake.script_message(scripted)
    through = _answer(_through(gateway).chat.completions.create(model="fake", messages=MESSAGES, tools=[WEATHER_TOOL]))
    assert through == direct
    forwarded = gateway.fake.last_body()
    assert forwarded["messages"] == MESSAGES
    # The client's tools, then the gateway's rehydration tool (declared from the first request, so
    # the tool list, which opens the prompt, never changes and the provider's cache keeps hitting).
    assert forwarded["tools"][0] == WEATHER_TOOL and forwarded["tools"][1]["function"]["name"] == "gateway_rehydrate"
    assert len(forwarded["tools"]) == 2


@pytest.mark.parametrize("scripted", [
    {"role": "assistant", "content": "A long streamed answer " * 12},
    TOOL_CALL_MESSAGE,
])
@pytest.mark.parametrize("include_usage", [False, True])
def test_streaming_answers_match_direct(gateway: RunningGateway, scripted: dict, include_usage: bool) -> None:
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    gateway.fake.script_message(scripted)
    direct = _streamed(_direct(gateway).chat.completions.create(
        model="fake", messages=MESSAGES, tools=[WEATHER_TOOL], stream=True, **options))
    gateway.fake.script_message(scripted)
    through = _streamed(_through(gateway).chat.completions.create(
        model="fake", messages=MESSAGES, tools=[WEATHER_TOOL], stream=True, **options))
    assert through == direct
    if not include_usage:
        assert through["usage"] is None


async def test_async_client_streaming_and_not(gateway: RunningGateway) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)
    gateway.fake.script_message({"role": "assistant", "content": "async hello"})
    completion = await client.chat.completions.create(model="fake", messages=MESSAGES)
    assert completion.choices[0].message.content == "async hello"
    gateway.fake.script_message({"role": "assistant", "content": "async streamed hello"})
    stream = await client.chat.completions.create(model="fake", messages=MESSAGES, stream=True)
    parts = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
    assert "".join(parts) == "async streamed hello"
    await client.close()


def test_passes_unknown_and_sampling_fields_through(gateway: RunningGateway) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "ok"})
    _through(gateway).chat.completions.create(
        model="fake", messages=MESSAGES, temperature=0.25, seed=7, max_tokens=33, user="u-1",
        tool_choice="auto", tools=[WEATHER_TOOL], extra_body={"vendor_knob": {"x": 1}},
    )
    body = gateway.fake.last_body()
    assert body["temperature"] == 0.25 and body["seed"] == 7 and body["max_tokens"] == 33
    assert body["user"] == "u-1" and body["tool_choice"] == "auto"
    assert body["vendor_knob"] == {"x": 1}


def test_request_id_header_and_record(gateway: RunningGateway) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "recorded"})
    raw = _through(gateway).chat.completions.with_raw_response.create(model="fake", messages=MESSAGES)
    request_id = raw.headers["x-gateway-request-id"]
    assert request_id.startswith("req_")
    with gateway.client() as http:
        record = http.get(f"/api/requests/{request_id}").json()
    assert record["status"] == "ok"
    assert record["model"] == "fake" and record["upstream_model"] == "openai/fake"
    assert record["response"]["choices"][0]["message"]["content"] == "recorded"
    assert record["usage"]["completion_tokens"] == 7
