"""The upstream seam (gateway/upstream/seam.py): one call and one stream, the API named as data, through the
app's wrappers as the app stacks them (tracing around routing, gateway/app.py) down to a recording client.

Each API reaches the client as it was named, a failed try is retried on the same terms, and each call
or stream is one span named for its operation and carrying its API.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator, get_args

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.errors import UpstreamRateLimited
from gateway.upstream.deployments import RoutedUpstream
from gateway.upstream.seam import Api, Prices, UpstreamRequest
from gateway.upstream.tracing import TracedUpstream
from testkit.gateway import settings_for

OPERATIONS = {"chat": "chat", "messages": "chat", "responses": "chat", "generate_content": "chat",
              "embeddings": "embeddings", "completions": "text_completion"}


class RecordingUpstream:
    """Answers every API with a marker of it; the first try of each call fails with a 429."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bool]] = []  # (how, api, whether a traceparent was sent)

    def _note(self, how: str, api: str, request: UpstreamRequest) -> bool:
        self.seen.append((how, api, "traceparent" in request.extra_headers))
        return sum(1 for entry in self.seen if entry[:2] == (how, api)) == 1

    async def warm_up(self) -> None:
        return None

    async def call(self, api: Api, request: UpstreamRequest) -> dict[str, Any]:
        if self._note("call", api, request):
            raise UpstreamRateLimited("upstream: slow down", headers={"retry-after": "0"})
        return {"answered_in": api}

    async def stream(self, api: Api, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        if self._note("stream", api, request):
            raise UpstreamRateLimited("upstream: slow down", headers={"retry-after": "0"})
        yield {"type": "first", "api": api}
        yield {"type": "second", "api": api}

    def cost_usd(self, litellm_params: Any, usage: Any) -> float | None:
        return None

    def prices(self, litellm_params: Any) -> Prices | None:
        return None


async def _no_wait(seconds: float) -> None:
    return None


@pytest.fixture
def stack(tmp_path: Path) -> tuple[TracedUpstream, RecordingUpstream, InMemorySpanExporter]:
    settings = settings_for("http://upstream.test/v1", f"sqlite:///{tmp_path / 'gateway.db'}", tmp_path,
                            router={"num_retries": 1})
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    inner = RecordingUpstream()
    routed = RoutedUpstream(inner, settings, None, sleep=_no_wait)
    return TracedUpstream(routed, provider.get_tracer("test"), capture_content=False), inner, exporter


def request() -> UpstreamRequest:
    return UpstreamRequest(alias="fake", litellm_params={"model": "openai/fake"}, body={}, timeout_seconds=5,
                           request_id="req_1")


@pytest.mark.parametrize("api", get_args(Api))
def test_a_call_reaches_the_client_in_its_api_retried_and_traced(stack: Any, api: Api) -> None:
    client, inner, exporter = stack
    sent = request()
    answer = asyncio.run(client.call(api, sent))

    assert answer == {"answered_in": api}
    assert inner.seen == [("call", api, True), ("call", api, True)]  # the 429, then the retry
    assert [attempt.outcome for attempt in sent.attempts] == ["rate_limit_exceeded", "ok"]
    [span] = exporter.get_finished_spans()
    assert span.name == f"{OPERATIONS[api]} fake" and span.attributes["gateway.upstream_api"] == api


@pytest.mark.parametrize("api", [api for api in get_args(Api) if api != "embeddings"])
def test_a_stream_reaches_the_client_in_its_api_retried_and_traced(stack: Any, api: Api) -> None:
    client, inner, exporter = stack

    async def read() -> list[dict[str, Any]]:
        return [event async for event in client.stream(api, request())]

    assert asyncio.run(read()) == [{"type": "first", "api": api}, {"type": "second", "api": api}]
    assert inner.seen == [("stream", api, True), ("stream", api, True)]
    [span] = exporter.get_finished_spans()
    assert span.name == f"{OPERATIONS[api]} fake" and span.attributes["gateway.upstream_api"] == api
