"""Closing what LiteLLM streams, every layer of it, down to the HTTP connection, however the stream ends.

LiteLLM's stream objects close with `aclose()` (`CustomStreamWrapper`, the Anthropic Messages and
Responses iterators), which is how a stream is meant to be stopped. Not every layer reaches the
connection, though: `TextCompletionStreamWrapper` has no close at all and wraps two async generators
around a `CustomStreamWrapper`; an async generator closed at its `yield` (the Anthropic Messages chunk
processor, `_async_streaming`) does not close the response it was reading; and a streamed text
completion goes over an HTTP client LiteLLM makes for that one call, whose pool keeps the connection
open (CLOSE-WAIT once the upstream hangs up) until the garbage collector finds the client. Left to
the collector, hundreds of streams leave hundreds of sockets.

`LiteLLMStream` iterates a stream LiteLLM returned and, when the iteration ends (the last chunk, an
error, a consumer that stops early, a cancelled request), closes it: LiteLLM's own `aclose()` first,
then every layer found beneath it (a wrapper's `completion_stream`, the openai SDK stream, the
`httpx.Response`, the call's own client), looked up in the suspended generators' frames once the
first chunk has come (a finished generator has no frame left) and again at the end. Closing is
shielded from the cancellation a client's disconnect brings, so it completes.
"""
from __future__ import annotations

import inspect
from typing import Any, Iterator

import httpx
from litellm.llms.openai.common_utils import OpenAIAsyncHTTPClient

from gateway.upstream.seam import close_stream

_DEPTH = 6  # layers looked through below the stream LiteLLM returned (text completions have five)


def _is_layer(value: Any) -> bool:
    """Whether a value held by a stream (an attribute, a generator's local) is part of that stream."""
    try:
        return (inspect.isasyncgen(value) or hasattr(value, "completion_stream")
                or isinstance(value, httpx.Response) or isinstance(getattr(value, "response", None), httpx.Response)
                or _own_client(value) is not None)
    except Exception:  # a local whose attributes cannot be read is no stream
        return False


def _own_client(value: Any) -> httpx.AsyncClient | None:
    """The HTTP client LiteLLM made for one call (alone, or inside the openai client it made with it):
    `OpenAIAsyncHTTPClient` is never shared, and closes itself when collected."""
    if isinstance(value, OpenAIAsyncHTTPClient):
        return value
    inner = getattr(value, "_client", None)
    return inner if isinstance(inner, OpenAIAsyncHTTPClient) else None


def layers(stream: Any, depth: int = 0) -> Iterator[Any]:
    """The objects a stream is made of that hold the connection or close it, outermost first."""
    if stream is None or depth > _DEPTH:
        return
    client = _own_client(stream)
    if client is not None:
        yield client
        return
    yield stream
    if inspect.isasyncgen(stream):
        frame = stream.ag_frame  # None once the generator has finished
        held = list(frame.f_locals.values()) if frame is not None else []
    else:
        held = [getattr(stream, "completion_stream", None), getattr(stream, "response", None)]
    for value in held:
        if value is not None and value is not stream and _is_layer(value):
            yield from layers(value, depth + 1)


class LiteLLMStream:
    """A stream LiteLLM returned, as an async iterator that closes every layer of it on leaving
    `async with` (or on `aclose()`): `async with LiteLLMStream(await litellm.acompletion(...)) as s`."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self._layers: dict[int, Any] = {}
        self._seen = False
        self._closed = False

    def _note_layers(self) -> None:
        for layer in layers(self.stream):
            self._layers.setdefault(id(layer), layer)

    def __aiter__(self) -> "LiteLLMStream":
        return self

    async def __anext__(self) -> Any:
        item = await self.stream.__anext__()
        if not self._seen:  # the generators inside are under way now: their frames hold the connection
            self._seen = True
            self._note_layers()
        return item

    async def __aenter__(self) -> "LiteLLMStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._note_layers()
        found = list(self._layers.values())
        self._layers.clear()
        clients = [layer for layer in found if _own_client(layer) is not None]
        for layer in [layer for layer in found if _own_client(layer) is None] + clients:
            # The stream itself first (LiteLLM's own way to stop it), the call's client last.
            if inspect.isasyncgen(layer) and layer.ag_running:
                continue  # being read elsewhere (a pump task of LiteLLM's): its reader closes it
            await close_stream(layer)
