"""The narrow interface to model providers: one call and one stream, the API they speak named as data."""
from __future__ import annotations

import inspect
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal, Mapping, Protocol, Sequence, TypeVar

import anyio

log = logging.getLogger("gateway.upstream")
_Stream = TypeVar("_Stream")

# The run's id (`UpstreamRequest.request_id`), sent by the upstream client with every call (OpenAI
# keeps this header in its own logs, so a support lookup there finds the run).
UPSTREAM_REQUEST_ID_HEADER = "x-client-request-id"

# The API an upstream call speaks; its answer and stream events are in that API's shape: Chat Completions
# (a chat.completion, chat.completion.chunk objects), Anthropic Messages, OpenAI Responses, Google's
# generateContent (GenerateContentResponse chunks), embeddings (no stream) and text completions.
Api = Literal["chat", "messages", "responses", "generate_content", "embeddings", "completions"]


@dataclass(frozen=True)
class UpstreamRequest:
    """One request to send: the config's model entry and the body (the fields of the API it is sent in)."""

    alias: str
    litellm_params: Mapping[str, Any]
    body: Mapping[str, Any]  # the format's fields except model and stream; messages are the projection
    timeout_seconds: float
    request_id: str
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    # Routing (gateway/upstream/deployments.py): the models a fallback may go to (None: any), the forwarded
    # prompt tokens (counted against a deployment's tpm), and the log every try is added to (shared
    # by the copies a conversation's hidden rounds make, so it covers the whole client request).
    models_allowed: frozenset[str] | None = None
    tokens: int = 0
    attempts: list["Attempt"] = field(default_factory=list)
    # The digests from parsing (gateway/wire/seen_messages.py) of the body's messages that are the
    # client's as it sent them, by place (None for the others; None for all when a place was dropped):
    # the direct transport's memo knows those messages by them.
    client_digests: Sequence[bytes | None] | None = None


@dataclass(frozen=True)
class Attempt:
    """One try of an upstream call: which deployment, how it ended, how long it took."""

    deployment: str
    model: str  # the model name it served (the requested one, or a fallback)
    upstream_model: str
    outcome: str  # "ok", or the error's code
    http_status: int | None
    latency_ms: float
    prices: "Prices | None" = field(default=None, compare=False)

    def record(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "model": self.model, "upstream_model": self.upstream_model,
                "outcome": self.outcome, "http_status": self.http_status, "latency_ms": self.latency_ms}


@dataclass(frozen=True)
class Prices:
    """USD per token: input, output, cached input read, cache write."""

    input: float
    output: float
    cache_read: float
    cache_write: float

    def cost(self, prompt: int, completion: int, cached: int = 0, cache_write: int = 0) -> float:
        """`prompt` includes the cached and cache-written tokens, as providers report it."""
        uncached = max(0, prompt - cached - cache_write)
        return (uncached * self.input + cached * self.cache_read + cache_write * self.cache_write
                + completion * self.output)


class UpstreamClient(Protocol):
    """Reaching providers: one call and one stream, each naming the API it speaks."""

    async def warm_up(self) -> None:
        """Do once, at start, what the first request would otherwise pay for."""

    async def call(self, api: Api, request: UpstreamRequest) -> dict[str, Any]:
        """The answer in `api`'s shape, as a plain dict (`request.body` is that API's request); raises
        UpstreamError."""

    def stream(self, api: Api, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        """The answer's stream events in `api`'s shape, as plain dicts; raises UpstreamError."""

    def cost_usd(self, litellm_params: Mapping[str, Any], usage: Mapping[str, Any]) -> float | None:
        """What the usage cost under the provider's price map, if known."""

    def prices(self, litellm_params: Mapping[str, Any]) -> Prices | None:
        """The model's prices: the config's own, else LiteLLM's cost map; None if unknown."""


class WrappedUpstream:
    """An `UpstreamClient` around another: what it does not change (warming up, prices, closing) is the
    wrapped client's. Subclasses wrap `call` and `stream`."""

    def __init__(self, inner: UpstreamClient) -> None:
        self.inner = inner

    async def warm_up(self) -> None:
        await self.inner.warm_up()

    def cost_usd(self, litellm_params: Mapping[str, Any], usage: Mapping[str, Any]) -> float | None:
        return self.inner.cost_usd(litellm_params, usage)

    def prices(self, litellm_params: Mapping[str, Any]) -> Prices | None:
        return self.inner.prices(litellm_params)

    async def aclose(self) -> None:
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()


async def close_stream(stream: Any) -> None:
    """Close a stream (`aclose()`, else an awaitable `close()`), however it ended. Shielded: a client that
    goes away cancels its request, and an unshielded close would be cancelled at its first await, leaving
    the upstream connection open. Quiet: a broken stream's own cleanup fails too, and its error was reported."""
    close = getattr(stream, "aclose", None) or getattr(stream, "close", None)
    if close is None:
        return
    with anyio.CancelScope(shield=True):
        try:
            closed = close()
            if inspect.isawaitable(closed):
                await closed
        except Exception as exc:
            log.debug("closing %s: %s", type(stream).__name__, exc)


@asynccontextmanager
async def closing(stream: _Stream) -> AsyncIterator[_Stream]:
    """`async with closing(events) as events:` the stream is closed on leaving the block, whatever the
    exit (its end, an error, a `GeneratorExit` at a `yield` inside, a cancellation)."""
    try:
        yield stream
    finally:
        await close_stream(stream)
