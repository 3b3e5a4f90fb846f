"""The direct transport sends what LiteLLM sends and gives the client what LiteLLM gives (issue 11).

Every request below goes to the real fake upstream twice, once through `DirectChat` and once through
`litellm.acompletion` (`LiteLLMUpstream(direct_transport=False)`), with the fake reset in between so
its ids and usage accounting repeat: the body it records (keys, values and key order), the headers
that matter, and the client-visible result (the completion dict, the list of chunk dicts, or the
UpstreamError with its message, headers and LiteLLM cause) must be the same. `created` is masked:
the fake and LiteLLM's stream wrapper both stamp the wall clock.
"""
from __future__ import annotations

import json
import re
import socket
from typing import Any

import pytest
import respx

from gateway.errors import UpstreamTimeout
from gateway.upstream.litellm_client.client import LiteLLMUpstream
from gateway.upstream.litellm_client.direct import direct_route
from gateway.upstream.seam import UpstreamRequest
from testkit.gateway import WEATHER_TOOL
from testkit.fake_upstream import FakeUpstream

USER = [{"role": "user", "content": "Weather in Paris?"}]
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
REQUESTS: dict[str, dict[str, Any]] = {
    "plain": {"messages": [{"role": "system", "content": "be brief"}, *USER]},
    "tools": {"messages": USER, "tools": [WEATHER_TOOL],
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": False},
    "tool choice auto as a dict": {"messages": USER, "tools": [WEATHER_TOOL], "tool_choice": {"type": "auto"}},
    "tool choice without tools": {"messages": USER, "tool_choice": "auto"},
    "sampling": {"messages": USER, "temperature": 0.25, "top_p": 0.9, "max_tokens": 64, "seed": 7,
                 "response_format": {"type": "json_object"}, "stop": ["a", "b", "c", "d", "e"]},
    "unknown field": {"messages": USER, "vendor_knob": {"level": 3, "nested": [1, None, {"x": None}]}},
    "image parts": {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": "https://example.test/a.png"},
        {"type": "image_url", "image_url": {"url": "https://example.test/b.png", "format": "image/png",
                                            "detail": "low"}}]}]},
    "cache control": {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "long rules", "cache_control": {"type": "ephemeral"}}]},
        *USER]},
    "null params": {"messages": [{"role": "user", "content": "hi", "name": None},
                                 {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                                 {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
                    "tools": [WEATHER_TOOL], "temperature": None, "user": None},
    "developer role": {"messages": [{"role": "developer", "content": "be nice"}, *USER]},
    "client declined usage": {"messages": USER, "stream_options": {"include_usage": False}},
    "reasoning and extras": {"messages": USER, "reasoning_effort": "low", "user": "end-user-7", "n": 1,
                             "metadata": {"a": "b"}, "logprobs": True, "top_logprobs": 2},
    "unicode": {"messages": [{"role": "user", "content": "Grüße, 東京 — ✓"}]},
}
ANSWERS = [
    {"role": "assistant", "content": "Sunny in Paris, with a light breeze from the west."},
    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [TOOL_CALL]},
]
HEADERS = ("authorization", "content-type", "accept", "x-deployment", "x-gateway-request")


def params(fake: FakeUpstream, **extra: Any) -> dict[str, Any]:
    return {"model": "openai/fake", "api_base": fake.api_base, "api_key": "sk-upstream",
            "extra_headers": {"X-Deployment": "d1"}, "input_cost_per_token": 1e-6, **extra}


def request(litellm_params: dict[str, Any], body: dict[str, Any], timeout: float = 10.0) -> UpstreamRequest:
    return UpstreamRequest(alias="fake", litellm_params=litellm_params, body=json.loads(json.dumps(body)),
                           timeout_seconds=timeout, request_id="req-1", extra_headers={"x-gateway-request": "req-1"})


def masked(value: Any) -> Any:
    """`created` out (both the fake and LiteLLM's stream wrapper stamp the clock, and an error message
    may quote LiteLLM's `ModelResponse(..., created=<now>, ...)`), generated ids named."""
    text = re.sub(r'"created": \d+', '"created": 0', json.dumps(value, default=str))
    text = re.sub(r"created=\d+", "created=0", text)
    return json.loads(re.sub(r"chatcmpl-[0-9a-f]{8}-[0-9a-f-]{27}", "chatcmpl-generated", text))


async def outcome(upstream: LiteLLMUpstream, call: UpstreamRequest, stream: bool) -> dict[str, Any]:
    """What the client gets: the result, or the chunks that came before the error and the error."""
    got: list[dict[str, Any]] = []
    try:
        if stream:
            async for chunk in upstream.stream("chat", call):
                got.append(chunk)
        else:
            got.append(await upstream.call("chat", call))
        return {"result": masked(got)}
    except Exception as exc:
        message = re.sub(r"time taken=[\d.]+ seconds", "time taken=T", str(exc))
        return {"result": masked(got), "error": (type(exc).__name__, getattr(exc, "status_code", None),
                                                 getattr(exc, "code", None), getattr(exc, "headers", None),
                                                 masked(message), type(exc.__cause__).__name__)}


async def both(fake: FakeUpstream, litellm_params: dict[str, Any], body: dict[str, Any], stream: bool,
               timeout: float = 10.0, **step: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same call through DirectChat and through LiteLLM, each against a freshly reset fake."""
    out = []
    for direct in (True, False):
        fake.reset()
        if step:
            fake.script(**step)
        upstream = LiteLLMUpstream(direct_transport=direct)
        result = await outcome(upstream, request(litellm_params, body, timeout), stream)
        await upstream.aclose()
        sent = fake.requests[-1] if fake.requests else None
        if sent is not None:
            result["body"] = json.dumps(sent["body"])  # as text: key order counts too
            result["headers"] = {name: sent["headers"].get(name) for name in HEADERS}
            result["user-agent"] = sent["headers"].get("user-agent", "")
        out.append(result)
    direct_outcome, litellm_outcome = out
    assert direct_outcome.pop("user-agent", "").startswith("python-httpx")  # the direct path did send it
    assert litellm_outcome.pop("user-agent", "").startswith("AsyncOpenAI")
    return direct_outcome, litellm_outcome


# --------------------------------------------------------------------------- requests and answers


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("name", list(REQUESTS))
async def test_same_request_and_same_answer(fake: FakeUpstream, name: str, stream: bool) -> None:
    direct, via_litellm = await both(fake, params(fake), REQUESTS[name], stream)
    assert direct == via_litellm
    assert "error" not in direct
    assert direct["headers"]["authorization"] == "Bearer sk-upstream"
    assert direct["headers"]["x-deployment"] == "d1" and direct["headers"]["x-gateway-request"] == "req-1"
    assert "input_cost_per_token" not in direct["body"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("answer", range(len(ANSWERS)), ids=["text", "tool call", "text and tool call"])
async def test_same_answers_from_the_fake(fake: FakeUpstream, answer: int, stream: bool) -> None:
    body = {"messages": USER, "tools": [WEATHER_TOOL]}
    direct, via_litellm = await both(fake, params(fake), body, stream, message=ANSWERS[answer])
    assert direct == via_litellm
    if stream:
        chunks = direct["result"]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
        assert all("content" in c["choices"][0]["delta"] or c["choices"][0]["delta"].get("tool_calls")
                   or c["choices"][0]["finish_reason"] for c in chunks[1:-1])


def chunk(delta: dict[str, Any] | None, finish: str | None = None, **top: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    return {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1700000000, "model": "fake",
            "system_fingerprint": "fp_x", "choices": choices, **top}


USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}}
TOOL_DELTA = {"index": 0, "id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
STREAMS: dict[str, list[dict[str, Any]]] = {
    "openai tool call": [chunk({"role": "assistant", "content": None, "refusal": None}), chunk({"tool_calls": [TOOL_DELTA]}),
                         chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
                         chunk({}, "tool_calls"), chunk(None, usage=USAGE)],
    "reasoning": [chunk({"role": "assistant", "reasoning_content": "r"}), chunk({"reasoning": "s"}),
                  chunk({"content": "x"}), chunk({}, "stop"), chunk(None, usage=USAGE)],
    "usage on the finish chunk": [chunk({"role": "assistant", "content": "x"}), chunk({}, "stop", usage=USAGE)],
    "no usage at all": [chunk({"role": "assistant", "content": "hello there"}), chunk({}, "stop")],
    "content with the finish": [chunk({"role": "assistant", "content": "x"}), chunk({"content": "y"}, "stop"),
                                chunk(None, usage=USAGE)],
    "stop after a tool call": [chunk({"role": "assistant"}), chunk({"tool_calls": [TOOL_DELTA]}), chunk({}, "stop"),
                               chunk(None, usage=USAGE)],
    "provider finish reason": [chunk({"role": "assistant", "content": "x"}), chunk({}, "eos"), chunk(None, usage=USAGE)],
    "empty and null deltas": [chunk({}), chunk({"content": "a"}), chunk({"content": ""}), chunk({"content": None}),
                              chunk({}, "length"), chunk(None, usage=USAGE)],
    "model, id and extras": [chunk({"role": "assistant", "content": "x", "vendor": "v"}, model="gpt-x", id="a1",
                                   service_tier="default"),
                             chunk({}, "stop", id="a2", obfuscation="zz"), chunk(None, usage=USAGE, id="a3")],
}
COMPLETIONS: dict[str, dict[str, Any]] = {
    "finish reason null": {"id": "c", "object": "chat.completion", "created": 1, "model": "fake",
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                                        "finish_reason": None, "logprobs": None}]},
    "provider fields": {"id": "c", "object": "chat.completion", "created": 1, "model": "fake-2024",
                        "system_fingerprint": None, "vendor_top": {"a": 1},
                        "choices": [{"index": 0, "stop_reason": "###", "finish_reason": "stop",
                                     "message": {"content": "x", "refusal": None, "reasoning": "r", "vendor": "y"}}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                                  "completion_tokens_details": {"reasoning_tokens": 1}}},
    "two choices, no usage, no created": {
        "id": "c", "object": "chat.completion", "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"},
                    {"index": 1, "message": {"role": "assistant", "content": "b"}, "finish_reason": "length"}]},
}


def sse(events: list[dict[str, Any]], done: bool = True) -> str:
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + ("data: [DONE]\n\n" if done else "")


@pytest.mark.parametrize("name", list(STREAMS))
async def test_same_chunks_from_raw_streams(fake: FakeUpstream, name: str) -> None:
    direct, via_litellm = await both(fake, params(fake), {"messages": USER}, True,
                                     raw=sse(STREAMS[name]), content_type="text/event-stream")
    assert direct == via_litellm
    assert "error" not in direct


@pytest.mark.parametrize("name", list(COMPLETIONS))
async def test_same_completion_from_raw_answers(fake: FakeUpstream, name: str) -> None:
    direct, via_litellm = await both(fake, params(fake), {"messages": USER}, False, raw=json.dumps(COMPLETIONS[name]))
    assert direct == via_litellm
    assert "error" not in direct


async def test_clients_get_openai_shape(fake: FakeUpstream) -> None:
    """LiteLLM's artefacts are gone from both paths: no provider_specific_fields (the provider's own
    fields are back where it sent them), no null delta content, no completion-token split of LiteLLM's."""
    direct, _ = await both(fake, params(fake), {"messages": USER}, False, raw=json.dumps(COMPLETIONS["provider fields"]))
    choice = direct["result"][0]["choices"][0]
    assert "provider_specific_fields" not in json.dumps(direct["result"])
    assert choice["stop_reason"] == "###" and choice["message"]["vendor"] == "y"
    direct, _ = await both(fake, params(fake), {"messages": USER}, True)
    finish, usage = direct["result"][-2], direct["result"][-1]
    assert finish["choices"] == [{"finish_reason": "stop", "index": 0, "delta": {}}]
    assert set(usage["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}


async def test_request_bytes_are_identical() -> None:
    """Byte for byte, as respx sees both clients' requests (the fake only keeps the parsed body)."""
    url = "http://upstream.test/v1/chat/completions"
    answer = {"id": "c", "object": "chat.completion", "created": 1, "model": "fake",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
    litellm_params = {"model": "openai/fake", "api_base": "http://upstream.test/v1", "api_key": "sk-upstream"}
    for body in REQUESTS.values():
        sent = []
        with respx.mock(using="httpx") as mock:
            route = mock.post(url).respond(200, json=answer)
            for direct in (True, False):
                upstream = LiteLLMUpstream(direct_transport=direct)
                await upstream.call("chat", request(litellm_params, body))
                sent.append(route.calls.last.request.content)
        assert sent[0] == sent[1]


# --------------------------------------------------------------------------- errors

ERROR = {"message": "upstream says no", "type": "x", "param": None, "code": None}
FAILURES: dict[str, dict[str, Any]] = {
    "429 with retry-after": {"status": 429, "error": ERROR, "headers": {"retry-after": "7"}},
    "500": {"status": 500},
    "503": {"status": 503, "error": ERROR},
    "400": {"status": 400, "error": ERROR},
    "401": {"status": 401, "error": ERROR},
    "404 as text": {"status": 404, "raw": "no such route", "content_type": "text/plain"},
    "HTML 200": {"raw": "<html><body><h1>502 Bad Gateway</h1></body></html>", "content_type": "text/html"},
    "truncated JSON 200": {"raw": '{"id": "chatcmpl-1", "choices": [{"index": 0, "mess'},
    "JSON without choices": {"raw": '{"id": "chatcmpl-1", "object": "chat.completion", "usage": {}}'},
    "a choice without a message": {"raw": '{"id": "c", "object": "chat.completion", "choices": [{"index": 0}]}'},
    "SSE without a finish": {"raw": 'data: {"id": "x", "choices": []}\n\ndata: [DONE]\n\n',
                             "content_type": "text/event-stream"},
    "SSE cut before the finish": {"raw": sse([chunk({"content": "par"}), chunk({"content": "tial"})], done=False),
                                  "content_type": "text/event-stream"},
    "SSE error event": {"raw": sse([chunk({"role": "assistant", "content": "a"}), {"error": {"message": "boom"}}]),
                        "content_type": "text/event-stream"},
    "SSE event that is no JSON": {"raw": sse([chunk({"role": "assistant", "content": "a"})], done=False)
                                  + "data: {nope\n\n", "content_type": "text/event-stream"},
    "truncated stream": {"message": {"role": "assistant", "content": "a long answer " * 20}, "break_stream_after": 3},
    "timeout": {"delay": 1.0},
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("name", list(FAILURES))
async def test_same_errors(fake: FakeUpstream, name: str, stream: bool) -> None:
    # A short timeout only where the upstream is made to be late: the others are no race against the clock
    # (at 0.3 s for all, a slow moment of a shared machine timed one path out now and then).
    timeout = 0.3 if name == "timeout" else 10.0
    direct, via_litellm = await both(fake, params(fake), {"messages": USER}, stream, timeout=timeout, **FAILURES[name])
    assert direct == via_litellm
    if name != "truncated stream" or stream:
        assert "error" in direct
    if name == "429 with retry-after":
        assert direct["error"][:4] == ("UpstreamRateLimited", 429, "rate_limit_exceeded", {"retry-after": "7"})
    if name == "timeout":
        assert direct["error"][0] == "UpstreamTimeout" and direct["error"][-1] == "Timeout"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_connection_refused_maps_the_same(fake: FakeUpstream, stream: bool) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    closed = params(fake, api_base=f"http://127.0.0.1:{port}/v1")
    out = []
    for direct in (True, False):
        upstream = LiteLLMUpstream(direct_transport=direct)
        out.append(await outcome(upstream, request(closed, {"messages": USER}), stream))
    assert out[0] == out[1]
    assert out[0]["error"][:3] == ("UpstreamUnavailable", 502, "upstream_unavailable")
    assert out[0]["error"][4] == "upstream: the provider could not be reached"


# --------------------------------------------------------------------------- which deployments go direct


@pytest.mark.parametrize("litellm_params", [
    {"model": "openai/fake", "mock_response": "hi", "api_base": "http://x/v1", "api_key": "k"},
    {"model": "openai/o3-mini", "api_base": "http://x/v1", "api_key": "k"},
    {"model": "openai/gpt-5", "api_base": "http://x/v1", "api_key": "k"},
    {"model": "anthropic/claude-sonnet-4-5", "api_base": "http://x/v1", "api_key": "k"},
    {"model": "custom_openai/fake", "api_base": "http://x/v1", "api_key": "k"},
    {"model": "hosted_vllm/fake", "api_base": "http://x/v1", "api_key": "k"},
    {"model": "openai/fake", "api_key": "k"},
    {"model": "openai/fake", "api_base": "http://x/v1"},
    {"model": "openai/fake", "api_base": "http://x/v1", "api_key": "k", "custom_llm_provider": "openai"},
    {"model": "openai/fake", "api_base": "http://x/v1", "api_key": "k", "extra_body": {"a": 1}},
    {"model": "openai/fake", "api_base": "http://x/v1", "api_key": "k", "max_retries": 2},
], ids=["mock_response", "o-series", "gpt-5", "anthropic", "custom_openai", "hosted_vllm", "no api_base",
        "no api_key", "custom_llm_provider", "extra_body", "max_retries"])
def test_not_eligible(litellm_params: dict[str, Any]) -> None:
    assert direct_route(litellm_params) is None


@pytest.mark.parametrize("model", ["openai/fake", "openai/gpt-4o-mini", "gpt-4o-mini"])
def test_eligible(model: str) -> None:
    route = direct_route({"model": model, "api_base": "http://x/v1/", "api_key": "k", "timeout": 30,
                          "extra_headers": {"X-A": "b"}, "input_cost_per_token": 1e-6,
                          "output_cost_per_token": 2e-6})
    assert route is not None
    assert route.url == "http://x/v1/chat/completions"
    assert route.model == model.removeprefix("openai/")


async def test_mock_deployment_still_answers_through_litellm() -> None:
    upstream = LiteLLMUpstream(direct_transport=True)
    answer = await upstream.call("chat", request({"model": "openai/demo", "mock_response": "demo says hi"},
                                             {"messages": USER}))
    assert answer["choices"][0]["message"]["content"] == "demo says hi"


async def test_streams_of_several_choices_go_through_litellm(fake: FakeUpstream) -> None:
    upstream = LiteLLMUpstream(direct_transport=True)
    [_ async for _ in upstream.stream("chat", request(params(fake), {"messages": USER, "n": 2}))]
    assert fake.requests[-1]["headers"]["user-agent"].startswith("AsyncOpenAI")


async def test_environment_switches_it_off(fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_DIRECT_TRANSPORT", "0")
    await LiteLLMUpstream().call("chat", request(params(fake), {"messages": USER}))
    assert fake.requests[-1]["headers"]["user-agent"].startswith("AsyncOpenAI")
    monkeypatch.delenv("GATEWAY_DIRECT_TRANSPORT")
    await LiteLLMUpstream().call("chat", request(params(fake), {"messages": USER}))
    assert fake.requests[-1]["headers"]["user-agent"].startswith("python-httpx")


async def test_one_pooled_client_per_loop(fake: FakeUpstream) -> None:
    upstream = LiteLLMUpstream(direct_transport=True)
    for _ in range(5):
        await upstream.call("chat", request(params(fake), {"messages": USER}))
    assert upstream._direct is not None and len(upstream._direct._clients) == 1
    client = next(iter(upstream._direct._clients.values()))
    await upstream.aclose()
    assert client.is_closed and not upstream._direct._clients


async def test_timeout_is_per_request(fake: FakeUpstream) -> None:
    upstream = LiteLLMUpstream(direct_transport=True)
    fake.script(delay=0.5)
    answer = await upstream.call("chat", request(params(fake), {"messages": USER}, timeout=5))
    assert answer["choices"][0]["message"]["content"] == "ok"
    fake.script(delay=0.5)
    with pytest.raises(UpstreamTimeout) as caught:
        await upstream.call("chat", request(params(fake), {"messages": USER}, timeout=0.1))
    assert caught.value.status_code == 504


async def test_a_growing_transcript_sends_what_litellm_sends(fake: FakeUpstream) -> None:
    """Turn after turn through one upstream, whose memo prepares the messages it has seen before."""
    direct, via_litellm = LiteLLMUpstream(direct_transport=True), LiteLLMUpstream(direct_transport=False)
    transcript = [{"role": "system", "content": "be brief"}, *USER]
    for turn in range(4):
        sent = []
        for upstream in (direct, via_litellm):
            fake.reset()
            await upstream.call("chat", request(params(fake), {"messages": transcript, "tools": [WEATHER_TOOL]}))
            sent.append(json.dumps(fake.requests[-1]["body"]))
        assert sent[0] == sent[1]
        call = {**TOOL_CALL, "id": f"c{turn}", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        transcript = [*transcript, {"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": f"c{turn}", "content": f"sunny {turn}", "name": None}]
    assert len(direct._memo._prepared) == len(transcript) - 2
    await direct.aclose()
