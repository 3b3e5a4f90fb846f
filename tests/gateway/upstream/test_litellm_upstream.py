"""Unit tests of the LiteLLM adapter (`gateway.upstream.litellm_client.client`), its HTTP mocked with respx.

How respx gets to see LiteLLM's requests (checked against litellm 1.110.2, respx 0.23.1):

* LiteLLM's `openai/...` provider drives the `openai` SDK over an `httpx.AsyncClient`
  whose *transport* is LiteLLM's aiohttp transport by default. respx's default
  mocker patches httpcore, which that transport never touches, so a bare
  `respx.mock()` sees nothing and the call fails with "Connection error".
* `respx.mock(using="httpx")` patches `httpx.AsyncClient._transport_for_url`, one
  level above the transport, so it intercepts the call whatever the transport is.
  That is what these tests use.
* `DISABLE_AIOHTTP_TRANSPORT=True` (env) also works with the default mocker, but
  only for an OpenAI client LiteLLM builds after the variable is set: LiteLLM caches
  clients per (api_key, api_base, timeout, max_retries, ...) in
  `litellm.in_memory_llm_clients_cache`, so a client built earlier in the process
  (by another test) keeps its aiohttp transport and escapes respx. Setting it with
  `monkeypatch.setenv` inside a test is therefore order-dependent; it is not relied on.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any, AsyncIterator

import httpx
import litellm
import pytest
import respx

from gateway.errors import (
    InvalidRequest,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.upstream.litellm_client.client import LiteLLMUpstream
from gateway.upstream.seam import UpstreamRequest
from testkit.gateway import WEATHER_TOOL

API_BASE = "http://upstream.test/v1"
URL = f"{API_BASE}/chat/completions"
API_KEY = "sk-upstream-test"
PARAMS: dict[str, Any] = {"model": "openai/fake", "api_base": API_BASE, "api_key": API_KEY}
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Weather in Paris?"}]
PRICING = {
    "input_cost_per_token": 1e-6,
    "output_cost_per_token": 2e-6,
    "cache_read_input_token_cost": 5e-7,
    "cache_creation_input_token_cost": 3e-6,
}


def make_request(body: dict[str, Any] | None = None, *, params: dict[str, Any] | None = None,
                 timeout: float = 5.0, extra_headers: dict[str, str] | None = None) -> UpstreamRequest:
    return UpstreamRequest(
        alias="fake",
        litellm_params={**PARAMS, **(params or {})},
        body={"messages": MESSAGES, **(body or {})},
        timeout_seconds=timeout,
        request_id="req-test-1",
        extra_headers=extra_headers or {},
    )


def completion_body(message: dict[str, Any], finish_reason: str | None = "stop",
                    usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "fake",
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage or {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30},
    }


OK_BODY = completion_body({"role": "assistant", "content": "ok"})
ERROR_BODY = {"error": {"message": "upstream says no", "type": "x", "param": None, "code": None}}


SSE_HEADERS = {"content-type": "text/event-stream"}


def chunk(delta: dict[str, Any] | None, finish_reason: str | None = None,
          usage: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "chatcmpl-s1", "object": "chat.completion.chunk", "created": 1700000000, "model": "fake",
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def content_chunk(text: str) -> dict[str, Any]:
    return chunk({"content": text})


def sse(events: list[dict[str, Any]]) -> str:
    return "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"


STREAM_USAGE = {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30}
STREAM_EVENTS = [
    chunk({"role": "assistant", "content": ""}),
    content_chunk("Let me "),
    content_chunk("check."),
    chunk({"tool_calls": [{"index": 0, "id": "call_w1", "type": "function",
                           "function": {"name": "get_weather", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    chunk({}, finish_reason="tool_calls"),
    chunk(None, usage=STREAM_USAGE),
]
# LiteLLM raises "Stream ended before a finish_reason was received" for a stream without one.
SHORT_STREAM = [content_chunk("hi"), chunk({}, finish_reason="stop"), chunk(None, usage=STREAM_USAGE)]


def token_counts(usage: dict[str, Any]) -> dict[str, Any]:
    """The three counts; LiteLLM may add e.g. completion_tokens_details of its own."""
    return {key: usage.get(key) for key in ("prompt_tokens", "completion_tokens", "total_tokens")}


def sent_json(route: respx.Route) -> dict[str, Any]:
    return json.loads(route.calls.last.request.content)


@pytest.fixture
def upstream() -> LiteLLMUpstream:
    return LiteLLMUpstream()


@pytest.fixture
def mock() -> Any:
    with respx.mock(using="httpx", assert_all_called=False) as router:
        yield router


async def collect(chunks: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [chunk async for chunk in chunks]


# --------------------------------------------------------------------------- complete()


async def test_complete_sends_the_openai_request(upstream: LiteLLMUpstream, mock: respx.MockRouter) -> None:
    route = mock.post(URL).respond(200, json=OK_BODY)
    body = {
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "temperature": 0.25,
        "vendor_knob": {"level": 3, "nested": [1, None, {"x": None}]},  # unknown to OpenAI and LiteLLM
        "user": "end-user-7",  # LiteLLM lists it as unsupported for non-catalog models
    }
    await upstream.call("chat", make_request(body, extra_headers={"x-gateway-request": "req-test-1"}))

    assert route.call_count == 1
    request = route.calls.last.request
    assert request.method == "POST"
    assert str(request.url) == URL
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.headers["x-gateway-request"] == "req-test-1"
    sent = sent_json(route)
    assert sent["model"] == "fake"
    assert sent["messages"] == MESSAGES
    assert sent["tools"] == [WEATHER_TOOL]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["temperature"] == 0.25
    assert sent["vendor_knob"] == {"level": 3, "nested": [1, None, {"x": None}]}  # untouched, nulls kept
    assert sent["user"] == "end-user-7"
    assert "stream" not in sent and "stream_options" not in sent
    assert "extra_body" not in sent  # merged into the body, not nested
    assert set(sent) == {"model", "messages", "tools", "tool_choice", "temperature", "vendor_knob", "user"}


async def test_complete_merges_config_extra_body_with_client_fields(
    upstream: LiteLLMUpstream, mock: respx.MockRouter
) -> None:
    route = mock.post(URL).respond(200, json=OK_BODY)
    await upstream.call("chat", make_request({"vendor_knob": "client"},
                                         params={"extra_body": {"config_knob": True, "vendor_knob": "config"}}))
    sent = sent_json(route)
    assert sent["config_knob"] is True
    assert sent["vendor_knob"] == "client"  # the client's field wins over the config's default


async def test_complete_returns_a_plain_dict_without_nulls(upstream: LiteLLMUpstream, mock: respx.MockRouter) -> None:
    tool_call = {"id": "call_w1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    usage = {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30,
             "prompt_tokens_details": {"cached_tokens": 5}}
    mock.post(URL).respond(200, json=completion_body(
        {"role": "assistant", "content": None, "tool_calls": [tool_call], "refusal": None},
        finish_reason="tool_calls", usage=usage))

    result = await upstream.call("chat", make_request({"tools": [WEATHER_TOOL]}))

    assert type(result) is dict
    json.dumps(result)  # plain JSON data, no pydantic objects left
    assert result["object"] == "chat.completion"
    assert result["id"] == "chatcmpl-1"
    choice = result["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert "content" in message and message["content"] is None  # kept although None
    assert message["role"] == "assistant"
    assert message["tool_calls"] == [tool_call]
    assert result["usage"]["prompt_tokens"] == 21
    assert result["usage"]["completion_tokens"] == 9
    assert result["usage"]["total_tokens"] == 30
    assert result["usage"]["prompt_tokens_details"]["cached_tokens"] == 5

    def nones(value: Any, path: str = "") -> list[str]:
        if isinstance(value, dict):
            return [p for k, v in value.items() for p in nones(v, f"{path}.{k}")]
        if isinstance(value, list):
            return [p for i, v in enumerate(value) for p in nones(v, f"{path}[{i}]")]
        return [path] if value is None else []

    # None only where OpenAI's schema requires the key: message.content (and finish_reason).
    assert nones(result) == [".choices[0].message.content"]
    assert "system_fingerprint" not in result
    assert "logprobs" not in choice
    assert "function_call" not in message and "refusal" not in message


async def test_complete_keeps_null_finish_reason_and_text_content(
    upstream: LiteLLMUpstream, mock: respx.MockRouter
) -> None:
    mock.post(URL).respond(200, json=completion_body({"role": "assistant", "content": "Sunny."}, finish_reason=None))
    result = await upstream.call("chat", make_request())
    choice = result["choices"][0]
    assert choice["message"]["content"] == "Sunny."
    assert "tool_calls" not in choice["message"]
    # LiteLLM 1.110.2 fills a null finish_reason of a non-streamed answer with "stop"; the null
    # itself is kept by the adapter in stream chunks (see test_stream_yields_plain_dicts_in_order).
    assert choice["finish_reason"] == "stop"


async def test_pricing_keys_are_not_sent_to_the_provider(upstream: LiteLLMUpstream, mock: respx.MockRouter) -> None:
    route = mock.post(URL).respond(200, json=OK_BODY)
    await upstream.call("chat", make_request({"vendor_knob": 1}, params=PRICING))
    request = route.calls.last.request
    sent = sent_json(route)
    for key in PRICING:
        assert key not in sent
        assert key not in request.headers
        assert key not in request.content.decode()
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent["vendor_knob"] == 1


async def test_pricing_keys_are_not_sent_when_streaming(upstream: LiteLLMUpstream, mock: respx.MockRouter) -> None:
    route = mock.post(URL).respond(200, text=sse(SHORT_STREAM), headers=SSE_HEADERS)
    await collect(upstream.stream("chat", make_request(params=PRICING)))
    raw = route.calls.last.request.content.decode()
    for key in PRICING:
        assert key not in raw


# --------------------------------------------------------------------------- stream()


async def test_stream_yields_plain_dicts_in_order(upstream: LiteLLMUpstream, mock: respx.MockRouter) -> None:
    route = mock.post(URL).respond(200, text=sse(STREAM_EVENTS), headers=SSE_HEADERS)

    chunks = await collect(upstream.stream("chat", make_request({"tools": [WEATHER_TOOL]})))

    assert route.call_count == 1
    assert all(type(c) is dict for c in chunks)
    json.dumps(chunks)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)

    content = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert "".join(t for t in content if t) == "Let me check."
    texts = [t for t in content if t]
    assert texts == ["Let me ", "check."]  # in order, not merged

    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert len(calls) == 3  # the split is kept, one fragment per chunk
    assert calls[0]["id"] == "call_w1" and calls[0]["function"]["name"] == "get_weather"
    assert all(tc["index"] == 0 for tc in calls)
    assert "".join(tc["function"]["arguments"] for tc in calls) == '{"city": "Paris"}'
    assert all("id" not in tc for tc in calls[1:])  # None ids dropped, not sent as null

    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "tool_calls"
    assert all(f is None for f in finishes[:-1])
    assert all("finish_reason" in c["choices"][0] for c in chunks if c["choices"])  # null kept

    # content first, then the tool call, then the finish, then usage last
    kinds = []
    for c in chunks:
        if not c["choices"]:
            kinds.append("usage")
        elif c["choices"][0]["finish_reason"]:
            kinds.append("finish")
        elif c["choices"][0]["delta"].get("tool_calls"):
            kinds.append("tool")
        elif c["choices"][0]["delta"].get("content"):
            kinds.append("text")
    assert kinds == ["text", "text", "tool", "tool", "tool", "finish", "usage"]

    last = chunks[-1]
    assert last["choices"] == []
    assert token_counts(last["usage"]) == STREAM_USAGE
    assert all("usage" not in c for c in chunks[:-1])


@pytest.mark.parametrize(
    "client_stream_options",
    [None, {"include_usage": False}],
    ids=["client-did-not-ask", "client-said-no"],
)
async def test_stream_always_asks_for_usage(
    upstream: LiteLLMUpstream, mock: respx.MockRouter, client_stream_options: dict[str, Any] | None
) -> None:
    route = mock.post(URL).respond(200, text=sse(SHORT_STREAM),
                                   headers=SSE_HEADERS)
    body = {} if client_stream_options is None else {"stream_options": client_stream_options}
    chunks = await collect(upstream.stream("chat", make_request(body)))
    sent = sent_json(route)
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert token_counts(chunks[-1]["usage"]) == STREAM_USAGE


async def test_stream_cut_before_finish_yields_then_raises(upstream: LiteLLMUpstream, mock: respx.MockRouter) -> None:
    # No finish_reason and no [DONE]: the connection ended mid-answer.
    text = "".join(f"data: {json.dumps(content_chunk(t))}\n\n" for t in ["par", "tial"])
    route = mock.post(URL).respond(200, text=text, headers=SSE_HEADERS)
    got: list[dict[str, Any]] = []
    with pytest.raises(UpstreamError) as caught:
        async for item in upstream.stream("chat", make_request()):
            got.append(item)
    assert [c["choices"][0]["delta"]["content"] for c in got] == ["par", "tial"]  # delivered before the error
    # LiteLLM 1.110.2 raises MidStreamFallbackError (a ServiceUnavailableError carrying status 500).
    assert isinstance(caught.value.__cause__, litellm.exceptions.MidStreamFallbackError)
    assert caught.value.status_code >= 500
    assert route.call_count == 1


async def test_stream_sends_the_same_fields_as_complete(upstream: LiteLLMUpstream, mock: respx.MockRouter) -> None:
    route = mock.post(URL).respond(200, text=sse(SHORT_STREAM), headers=SSE_HEADERS)
    await collect(upstream.stream("chat", make_request({"tools": [WEATHER_TOOL], "temperature": 0.5,
                                                "vendor_knob": "v", "user": "u-1"})))
    request = route.calls.last.request
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    sent = sent_json(route)
    assert sent["messages"] == MESSAGES
    assert sent["tools"] == [WEATHER_TOOL]
    assert sent["temperature"] == 0.5
    assert sent["vendor_knob"] == "v"
    assert sent["user"] == "u-1"


# --------------------------------------------------------------------------- errors


async def _call(upstream: LiteLLMUpstream, streaming: bool, request: UpstreamRequest | None = None) -> None:
    request = request or make_request()
    if streaming:
        await collect(upstream.stream("chat", request))
    else:
        await upstream.call("chat", request)


streaming_modes = pytest.mark.parametrize("streaming", [False, True], ids=["complete", "stream"])


@streaming_modes
async def test_401_is_an_upstream_authentication_error(
    upstream: LiteLLMUpstream, mock: respx.MockRouter, streaming: bool
) -> None:
    route = mock.post(URL).respond(401, json=ERROR_BODY)
    with pytest.raises(UpstreamError) as caught:
        await _call(upstream, streaming)
    error = caught.value
    assert type(error) is UpstreamError
    assert error.status_code == 401
    assert error.error_type == "authentication_error"
    assert error.code == "upstream_authentication_failed"
    assert isinstance(error.__cause__, litellm.AuthenticationError)
    assert route.call_count == 1


@streaming_modes
async def test_429_is_rate_limited_and_keeps_retry_after(
    upstream: LiteLLMUpstream, mock: respx.MockRouter, streaming: bool
) -> None:
    route = mock.post(URL).respond(429, json=ERROR_BODY, headers={"retry-after": "7"})
    with pytest.raises(UpstreamRateLimited) as caught:
        await _call(upstream, streaming)
    error = caught.value
    assert error.status_code == 429
    assert error.error_type == "rate_limit_error"
    assert error.code == "rate_limit_exceeded"
    # LiteLLM 1.110.2 keeps the provider's response on RateLimitError, so the header survives.
    assert error.headers == {"retry-after": "7"}
    assert route.call_count == 1  # the openai SDK would retry a 429 unless max_retries is 0


@streaming_modes
@pytest.mark.parametrize("status", [500, 503])
async def test_5xx_keeps_the_upstream_status(
    upstream: LiteLLMUpstream, mock: respx.MockRouter, streaming: bool, status: int
) -> None:
    route = mock.post(URL).respond(status, json=ERROR_BODY)
    with pytest.raises(UpstreamError) as caught:
        await _call(upstream, streaming)
    error = caught.value
    assert type(error) is UpstreamError
    assert error.status_code == status
    assert error.error_type == "api_error"
    assert error.code == "upstream_error"
    assert error.headers == {}
    assert route.call_count == 1  # no retry of a 5xx


@streaming_modes
async def test_400_is_a_rejected_request(upstream: LiteLLMUpstream, mock: respx.MockRouter, streaming: bool) -> None:
    route = mock.post(URL).respond(400, json=ERROR_BODY)
    with pytest.raises(UpstreamError) as caught:
        await _call(upstream, streaming)
    assert caught.value.status_code == 400
    assert caught.value.error_type == "invalid_request_error"
    assert "upstream says no" in caught.value.message
    assert route.call_count == 1


@streaming_modes
async def test_connection_error_is_upstream_unavailable(
    upstream: LiteLLMUpstream, mock: respx.MockRouter, streaming: bool
) -> None:
    route = mock.post(URL).mock(side_effect=httpx.ConnectError("connection refused"))
    with pytest.raises(UpstreamError) as caught:
        await _call(upstream, streaming)
    assert route.call_count == 1
    assert type(caught.value) is UpstreamUnavailable
    assert caught.value.status_code == 502
    assert caught.value.code == "upstream_unavailable"


@streaming_modes
async def test_connection_error_is_not_retried(upstream: LiteLLMUpstream, mock: respx.MockRouter, streaming: bool) -> None:
    """LiteLLM reports a refused connection as its InternalServerError; the adapter reads the cause."""
    route = mock.post(URL).mock(side_effect=httpx.ConnectError("connection refused"))
    with pytest.raises(UpstreamError) as caught:
        await _call(upstream, streaming)
    assert route.call_count == 1
    assert isinstance(caught.value.__cause__, litellm.exceptions.InternalServerError)  # not APIConnectionError
    assert caught.value.message == "upstream: the provider could not be reached"  # LiteLLM's words go to the log


@streaming_modes
async def test_read_timeout_is_upstream_timeout(upstream: LiteLLMUpstream, mock: respx.MockRouter, streaming: bool) -> None:
    route = mock.post(URL).mock(side_effect=httpx.ReadTimeout("too slow"))
    with pytest.raises(UpstreamTimeout) as caught:
        await _call(upstream, streaming)
    assert caught.value.status_code == 504
    assert caught.value.error_type == "timeout"
    assert caught.value.code == "upstream_timeout"
    assert isinstance(caught.value.__cause__, litellm.Timeout)
    assert route.call_count == 1


@streaming_modes
async def test_timeout_seconds_is_honoured_on_a_real_socket(upstream: LiteLLMUpstream, streaming: bool) -> None:
    """A server that accepts and never answers: a tiny `timeout_seconds` must end the call (no respx here)."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await reader.read(65536)  # take the request, never reply

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    request = make_request(params={"api_base": f"http://127.0.0.1:{port}/v1"}, timeout=0.3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(UpstreamTimeout) as caught:
            await asyncio.wait_for(_call(upstream, streaming, request), timeout=10)
    finally:
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
    assert loop.time() - started < 5
    assert caught.value.status_code == 504
    assert len(accepted) == 1  # exactly one attempt


# --------------------------------------------------------------------------- no retries


# LiteLLM's get_supported_openai_params() for openai/* also lists its own call options
# ("max_retries", "extra_headers", "stream"); a client's body field of that name must be
# sent on in the body, never steer the call (retries, upstream HTTP headers).


@pytest.mark.parametrize("field, value", [
    ("max_retries", 2), ("extra_headers", {"Authorization": "Bearer client-key", "x-injected": "1"}),
    ("api_base", "http://elsewhere.test/v1"), ("custom_llm_provider", "openrouter"), ("mock_response", "made up"),
])
async def test_a_client_field_that_is_a_litellm_option_is_refused(
    upstream: LiteLLMUpstream, mock: respx.MockRouter, field: str, value: Any
) -> None:
    """Retries, upstream headers, endpoints, providers, mocks are the deployment's: a 400 naming the field,
    and nothing is sent (gateway/upstream/litellm_client/params.py)."""
    route = mock.post(URL).respond(200, json=OK_BODY)
    for api in ("chat", "embeddings", "completions"):
        with pytest.raises(InvalidRequest) as caught:
            await upstream.call(api, make_request({field: value}))
        assert caught.value.status_code == 400 and caught.value.param == field and field in caught.value.message
    assert route.call_count == 0


async def test_a_client_field_litellm_does_not_name_goes_in_the_body(
    upstream: LiteLLMUpstream, mock: respx.MockRouter
) -> None:
    route = mock.post(URL).respond(200, json=OK_BODY)
    await upstream.call("chat", make_request({"vendor_knob": {"x": 1}}))
    assert route.calls.last.request.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent_json(route)["vendor_knob"] == {"x": 1}


# --------------------------------------------------------------------------- cost_usd


def test_cost_with_explicit_prices_is_exact(upstream: LiteLLMUpstream) -> None:
    # Powers of two, so float arithmetic is exact and == is the right comparison.
    params = {"model": "openai/fake", "input_cost_per_token": 0.5, "output_cost_per_token": 2.0,
              "cache_read_input_token_cost": 0.125}
    usage = {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200,
             "prompt_tokens_details": {"cached_tokens": 400}}
    assert upstream.cost_usd(params, usage) == 600 * 0.5 + 400 * 0.125 + 200 * 2.0 == 750.0


def test_cost_with_realistic_explicit_prices(upstream: LiteLLMUpstream) -> None:
    usage = {"prompt_tokens": 1000, "completion_tokens": 200, "prompt_tokens_details": {"cached_tokens": 300}}
    # 700 * 1e-6 + 300 * 5e-7 + 200 * 2e-6 = 0.0007 + 0.00015 + 0.0004
    assert upstream.cost_usd({**PARAMS, **PRICING}, usage) == pytest.approx(0.00125, rel=1e-12)


def test_cost_cached_tokens_default_to_the_input_price(upstream: LiteLLMUpstream) -> None:
    params = {"model": "openai/fake", "input_cost_per_token": 0.5, "output_cost_per_token": 2.0}
    with_cache = {"prompt_tokens": 1000, "completion_tokens": 200, "prompt_tokens_details": {"cached_tokens": 400}}
    without = {"prompt_tokens": 1000, "completion_tokens": 200}
    assert upstream.cost_usd(params, with_cache) == upstream.cost_usd(params, without) == 900.0


def test_cost_without_output_price_counts_only_input(upstream: LiteLLMUpstream) -> None:
    params = {"model": "openai/fake", "input_cost_per_token": 0.25}
    assert upstream.cost_usd(params, {"prompt_tokens": 8, "completion_tokens": 1000}) == 2.0


def test_cost_tolerates_null_usage_fields(upstream: LiteLLMUpstream) -> None:
    params = {"model": "openai/fake", "input_cost_per_token": 0.5, "output_cost_per_token": 2.0}
    usage = {"prompt_tokens": 4, "completion_tokens": None, "prompt_tokens_details": None}
    assert upstream.cost_usd(params, usage) == 2.0
    assert upstream.cost_usd(params, {}) == 0.0


def test_cost_for_a_model_litellm_knows(upstream: LiteLLMUpstream) -> None:
    prices = litellm.model_cost["gpt-4o-mini"]  # the bundled map (LITELLM_LOCAL_MODEL_COST_MAP=True)
    usage = {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}
    cost = upstream.cost_usd({"model": "openai/gpt-4o-mini"}, usage)
    assert cost is not None and cost > 0
    expected = 1000 * prices["input_cost_per_token"] + 200 * prices["output_cost_per_token"]
    assert cost == pytest.approx(expected, rel=1e-9)

    cached = upstream.cost_usd({"model": "openai/gpt-4o-mini"},
                               {**usage, "prompt_tokens_details": {"cached_tokens": 400}})
    expected_cached = (600 * prices["input_cost_per_token"] + 400 * prices["cache_read_input_token_cost"]
                       + 200 * prices["output_cost_per_token"])
    assert cached == pytest.approx(expected_cached, rel=1e-9)
    assert cached < cost


def test_cost_is_none_for_an_unknown_model(upstream: LiteLLMUpstream) -> None:
    usage = {"prompt_tokens": 1000, "completion_tokens": 200}
    assert upstream.cost_usd({"model": "openai/fake", "api_base": API_BASE}, usage) is None
    assert upstream.cost_usd({"model": "no-such-provider/no-such-model"}, usage) is None


def test_known_digests_name_only_messages_forwarded_as_the_client_sent_them() -> None:
    """The parse's digests go to the direct transport's memo for the messages the projection forwarded
    as the client sent them (`Projection.as_sent`), not for one it replaced nor a hidden round's, and
    not once an attempt was made (LiteLLM may have fixed the messages in place)."""
    from gateway.pipeline.request_path import _as_sent_digests
    from gateway.upstream.litellm_client.client import _known_digests
    from gateway.upstream.seam import Attempt, UpstreamRequest
    from gateway.wire import NeutralRequest
    from policies.assembly_types import Projection
    client = [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c1", "content": "x" * 50},
              {"role": "assistant", "content": "ok"}]
    neutral = NeutralRequest(model="fake", messages=client, stream=False, params={}, digests=[b"d0", b"d1", None])
    sent = [dict(client[0]), {**client[1], "content": "[compacted]"}, dict(client[2])]
    projection = Projection(messages=sent, decisions=(), omissions={}, tokens_original=0, tokens_forwarded=0,
                            policy_name="p", policy_version="1", boundary_round=0, epoch_round=0,
                            as_sent=(True, False, True))
    digests = _as_sent_digests(neutral, projection)
    assert digests == [b"d0", None, None]
    assert _as_sent_digests(neutral, replace(projection, as_sent=())) is None  # a message was omitted
    assert _as_sent_digests(replace(neutral, digests=None), projection) is None
    request = UpstreamRequest(alias="fake", litellm_params={"model": "openai/fake"}, body={"messages": sent},
                              timeout_seconds=5, request_id="req_1", client_digests=digests)
    assert _known_digests(request) == [b"d0", None, None]
    longer = replace(request, body={"messages": [*sent, {"role": "tool", "tool_call_id": "g", "content": "r"}]})
    assert _known_digests(longer) == [b"d0", None, None, None]  # a hidden round's messages: unknown
    assert _known_digests(replace(request, client_digests=None)) is None
    tried = replace(request, attempts=[Attempt(deployment="d", model="fake", upstream_model="openai/fake",
                                               outcome="error", http_status=500, latency_ms=1.0)])
    assert _known_digests(tried) is None
