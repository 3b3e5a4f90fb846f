"""LiteLLMStream: what LiteLLM streams is closed down to the connection, whatever ends the reading.

Each test opens a real LiteLLM stream against a fake upstream of its own and counts this process's
sockets to it (scripts/processes.py): a connection still held shows as ESTABLISHED, or as CLOSE_WAIT
once the upstream has hung up. The collector is off throughout, so nothing here is closed by
garbage collection: only by the closing under test.
"""
from __future__ import annotations

import asyncio
import gc
import os
from typing import Any, Awaitable, Callable, Iterator

import anyio
import httpx
import pytest
from litellm.litellm_core_utils.streaming_handler import CustomStreamWrapper
from litellm.llms.openai.common_utils import OpenAIAsyncHTTPClient

from gateway.upstream.litellm_client.base import litellm
from gateway.upstream.litellm_client.streams import LiteLLMStream, layers
from scripts.processes import sockets_to
from testkit.fake_upstream import FakeUpstream

STORY = "Once upon a time a gateway closed every stream it opened. " * 4


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


@pytest.fixture(autouse=True)
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def held(fake: FakeUpstream) -> dict[str, int]:
    """This process's sockets to the fake upstream, by state."""
    return sockets_to(os.getpid(), fake._server.port)


def held_after(fake: FakeUpstream, scenario: Callable[[], Awaitable[None]]) -> dict[str, int]:
    """The sockets held once `scenario` has run, counted while its event loop still runs (closing the
    loop would close every async generator left open, and with them what they hold)."""
    async def run() -> dict[str, int]:
        await scenario()
        await asyncio.sleep(0.2)  # the upstream's side of a closed connection goes too
        return held(fake)

    return asyncio.run(run())


def opened(fake: FakeUpstream) -> dict[str, Callable[[], Awaitable[Any]]]:
    """How LiteLLM opens each kind of stream the gateway reads."""
    openai = {"api_base": fake.api_base, "api_key": "sk-upstream", "max_retries": 0, "stream": True}
    story = [{"role": "user", "content": "tell me a story"}]
    return {
        "text completion": lambda: litellm.atext_completion(model="openai/fake", prompt="tell me", **openai),
        "chat": lambda: litellm.acompletion(model="openai/fake", messages=story, **openai),
        "responses": lambda: litellm.aresponses(model="openai/gpt-4.1", input="tell me a story", **openai),
        "messages": lambda: litellm.anthropic.messages.acreate(
            model="anthropic/claude-haiku-4-5", messages=story, max_tokens=100, api_base=fake.url,
            api_key="sk-upstream", stream=True),
    }


KINDS = ["text completion", "chat", "responses", "messages"]


async def _read(fake: FakeUpstream, kind: str, first_only: bool) -> int:
    chunks = 0
    async with LiteLLMStream(await opened(fake)[kind]()) as stream:
        async for _ in stream:
            chunks += 1
            if first_only:
                break
    return chunks


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_left_after_its_first_chunk_holds_no_connection(upstream: FakeUpstream, kind: str) -> None:
    upstream.script(message={"content": STORY}, chunk_delay=0.05)

    async def first_chunk() -> None:
        assert await _read(upstream, kind, first_only=True) == 1

    assert held_after(upstream, first_chunk) == {}


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_read_to_its_end_holds_no_connection_but_a_pooled_one(upstream: FakeUpstream, kind: str) -> None:
    async def twice() -> None:
        for _ in range(2):
            upstream.script(message={"content": STORY})
            assert await _read(upstream, kind, first_only=False) >= 1

    # A client LiteLLM keeps may keep one idle connection; the text completion's own client is closed.
    assert held_after(upstream, twice) in ({}, {"ESTABLISHED": 1} if kind != "text completion" else {})


@pytest.mark.parametrize("kind", KINDS)
def test_a_read_cancelled_mid_stream_holds_no_connection(upstream: FakeUpstream, kind: str) -> None:
    """A client's disconnect cancels the request while it waits for the upstream's next chunk."""
    upstream.script(message={"content": STORY}, chunk_delay=5)

    async def cancelled() -> None:
        with anyio.move_on_after(0.5):
            await _read(upstream, kind, first_only=False)

    assert held_after(upstream, cancelled) == {}


def test_the_layers_of_a_text_completion_reach_its_response_and_its_own_client(upstream: FakeUpstream) -> None:
    """TextCompletionStreamWrapper has no close: what it wraps is found in its generators' frames."""
    upstream.script(message={"content": STORY}, chunk_delay=0.05)

    async def found() -> list[type]:
        async with LiteLLMStream(await opened(upstream)["text completion"]()) as stream:
            await stream.__anext__()
            return [type(layer) for layer in layers(stream.stream)]

    kinds = asyncio.run(found())
    assert CustomStreamWrapper in kinds and httpx.Response in kinds and OpenAIAsyncHTTPClient in kinds
