"""Chat completions posted straight to an OpenAI-compatible deployment over one pooled HTTP client (issue 11).

`litellm.acompletion` costs ~5 ms per call, mostly machinery a deployment that already speaks
OpenAI's wire format has no use for (logging objects, cost calculation, pydantic re-validation,
the openai SDK's client). For such a deployment `LiteLLMUpstream` hands the HTTP exchange to
`DirectChat`, but LiteLLM still decides everything else through a `DirectCodec`
(gateway/upstream/litellm_client/client.py): whether the deployment qualifies, the endpoint, credentials and
headers, the body (built by LiteLLM's own transformation functions), how an answer is read, and
how every failure reads. Both paths therefore send the same bytes and give the client the same
objects.

What lives here: the exchange over a pooled client, one per event loop (the one LiteLLM's OpenAI
handler makes, over its aiohttp transport; no retries, the request's own timeout), SSE
framing as the openai SDK decodes it, and `ChunkStream`, which applies to OpenAI chunks what
LiteLLM's stream wrapper applies to them (role on the first chunk, empty deltas dropped, the
finish chunk on its own, usage held for one closing chunk, ...), since that wrapper cannot run
without the per-call machinery this module exists to skip.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Mapping, Protocol

import httpx

from gateway.errors import UpstreamInvalidResponse
from gateway.upstream.seam import UpstreamRequest, close_stream
from policies.memo import memo


@dataclass(frozen=True)
class DirectCall:
    """One chat completion as LiteLLM would post it: where, with which headers, which exact body."""

    url: str
    headers: Mapping[str, str]
    body: bytes
    timeout: float
    model: str  # the deployment's model name, which LiteLLM's stream wrapper puts on every chunk
    request: UpstreamRequest


class ErrorEvent(Exception):
    """A stream event that carries an `error` (the openai SDK stops the stream on it)."""

    def __init__(self, message: str, body: Any) -> None:
        super().__init__(message)
        self.message = message
        self.body = body


class EndedWithoutFinish(Exception):
    """The stream closed cleanly before any choice finished."""


class Repetition(Exception):
    """The model kept sending the same content chunk (LiteLLM's loop guard)."""

    def __init__(self, content: str) -> None:
        super().__init__(content)
        self.content = content


class DirectCodec(Protocol):
    """LiteLLM's side of a direct exchange (implemented in gateway/upstream/litellm_client/client.py).

    Its errors come with `__cause__` set to the LiteLLM exception the LiteLLM path would have
    raised, so DirectChat raises them as they are, never `from` the transport's exception.
    """

    repetition_limit: int

    def completion(self, response: httpx.Response, call: DirectCall) -> dict[str, Any]:
        """A 200's (read) body as LiteLLM's path returns it; raises UpstreamError when it is no completion."""

    def status_error(self, response: httpx.Response, call: DirectCall) -> Exception:
        """The UpstreamError for an HTTP error status (the body has been read)."""

    def transport_error(self, error: Exception, call: DirectCall, elapsed: float, stream: bool) -> Exception:
        """The UpstreamError for a failure before any response (refused, reset, timed out)."""

    def stream_error(self, error: Exception, call: DirectCall, generated: str, started: bool) -> Exception:
        """The UpstreamError for a stream that failed after it began."""

    def finish_reason(self, reason: str) -> str:
        """A provider finish reason in OpenAI's vocabulary."""

    def usage_estimate(self, call: DirectCall, generated: str, reasoning: str) -> dict[str, Any]:
        """Usage counted locally, for an upstream that streamed none."""


class DirectChat:
    """Posts `DirectCall`s over one `httpx.AsyncClient` per event loop (its connection pool).

    `client` makes that client; LiteLLM's side passes the one LiteLLM's OpenAI handler makes (over
    its aiohttp transport, gateway/upstream/litellm_client/direct.py), so both paths reach the deployment alike.
    """

    def __init__(self, codec: DirectCodec, client: Callable[[], httpx.AsyncClient]) -> None:
        self._codec = codec
        self._make_client = client
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary())

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._make_client()
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        """Close the running loop's client (the others belong to loops that are gone or not running)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    async def _send(self, call: DirectCall, stream: bool) -> httpx.Response:
        client = self._client()
        request = client.build_request("POST", _url(call.url), content=call.body, headers=call.headers,
                                       timeout=httpx.Timeout(call.timeout))
        started = time.monotonic()
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._codec.transport_error(exc, call, time.monotonic() - started, stream)
        if response.status_code >= 400:
            try:
                await response.aread()
            except httpx.HTTPError as exc:
                raise self._codec.transport_error(exc, call, time.monotonic() - started, stream)
            finally:
                await close_stream(response)
            raise self._codec.status_error(response, call)
        return response

    async def complete(self, call: DirectCall) -> dict[str, Any]:
        """The chat.completion, as LiteLLM's path reads it."""
        started = time.monotonic()
        response = await self._send(call, stream=False)
        try:
            await response.aread()
        except httpx.HTTPError as exc:
            raise self._codec.transport_error(exc, call, time.monotonic() - started, False)
        finally:
            await close_stream(response)
        return self._codec.completion(response, call)

    async def stream(self, call: DirectCall) -> AsyncIterator[dict[str, Any]]:
        """chat.completion.chunk dicts, normalised as LiteLLM's stream wrapper does."""
        response = await self._send(call, stream=True)
        chunks = ChunkStream(call.model, self._codec.finish_reason, self._codec.repetition_limit)
        events = 0
        try:
            async for data in sse_data(response):
                if data.startswith("[DONE]"):
                    break
                events += 1
                for chunk in chunks.feed(_event(data)):
                    yield chunk
            if not events:
                content_type = response.headers.get("content-type", "unknown")
                raise UpstreamInvalidResponse(
                    f"upstream: the stream held no completion events (content-type {content_type})")
            for chunk in chunks.close(lambda: self._codec.usage_estimate(call, chunks.generated, chunks.reasoning)):
                yield chunk
        except (httpx.HTTPError, json.JSONDecodeError, ErrorEvent, EndedWithoutFinish, Repetition) as exc:
            raise self._codec.stream_error(exc, call, chunks.generated, chunks.started)
        finally:
            await close_stream(response)


@memo(maxsize=256)
def _url(url: str) -> httpx.URL:
    """A deployment's endpoint, parsed once (httpx URLs are immutable; parsing one is a tenth of a send)."""
    return httpx.URL(url)


async def sse_data(response: httpx.Response) -> AsyncIterator[str]:
    """The `data` of each server-sent event, dispatched as the openai SDK's decoder does."""
    event: str | None = None
    data: list[str] = []
    last_id: str | None = None
    retry: int | None = None
    async for line in response.aiter_lines():
        if not line:
            if event or data or last_id or retry is not None:
                yield "\n".join(data)
            event, data, retry = None, [], None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id" and "\0" not in value:
            last_id = value
        elif name == "retry" and value.isdigit():
            retry = int(value)


def _event(data: str) -> dict[str, Any]:
    """One event's JSON; an `error` in it ends the stream, as in the openai SDK."""
    payload = json.loads(data)
    if isinstance(payload, dict) and payload.get("error"):
        error = payload["error"]
        message = error.get("message") if isinstance(error, dict) else None
        if not message or not isinstance(message, str):
            message = "An error occurred during streaming"
        raise ErrorEvent(message, error)
    return payload


_CONTENT_KEYS = ("tool_calls", "function_call", "reasoning_content", "annotations")


@dataclass
class ChunkStream:
    """OpenAI chunks made into what LiteLLM's stream wrapper yields for them (single-choice streams).

    The wrapper stamps its own `created` and the deployment's model name on every chunk, names
    the role on the first chunk only, drops chunks that carry nothing (an empty content string,
    a lone role after the first chunk), maps `reasoning` to `reasoning_content`, sends the finish
    on a chunk of its own (after the content it came with), turns a `stop` after tool calls into
    `tool_calls`, and holds usage for one chunk after the finish.
    """

    model: str
    finish_reason: Callable[[str], str]
    repetition_limit: int
    created: int | None = None
    started: bool = False
    finished: str | None = None
    finish_sent: bool = False
    finish_choice: dict[str, Any] = field(default_factory=dict)
    tool_calls: bool = False
    usage: dict[str, Any] | None = None
    last_id: str | None = None
    fingerprint: str | None = None
    service_tier: str | None = None
    texts: list[str] = field(default_factory=list)
    thoughts: list[str] = field(default_factory=list)
    contents: list[Any] = field(default_factory=list)
    repeated: int = 1

    @property
    def generated(self) -> str:
        return "".join(self.texts)

    @property
    def reasoning(self) -> str:
        return "".join(self.thoughts)

    def feed(self, chunk: Any) -> list[dict[str, Any]]:
        if not isinstance(chunk, dict):
            return []
        if self.created is None:
            self.created = int(time.time())
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        if chunk.get("system_fingerprint") is not None:
            self.fingerprint = chunk["system_fingerprint"]
        if chunk.get("service_tier") is not None:
            self.service_tier = chunk["service_tier"]
        self.last_id = chunk.get("id") or f"chatcmpl-{uuid.uuid4()}"
        choices = chunk.get("choices") or []
        if not choices:
            return [] if chunk.get("usage") is not None else [self._emit(self._top(chunk), [])]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        delta = choice.get("delta") or {}
        reason = choice.get("finish_reason")
        out = []
        if self._carries_something(delta):
            self._guard_repetition()
            out.append(self._emit(self._top(chunk), [self._content_choice(choice, delta)]))
        if reason:
            self.finished = reason
            self.finish_choice = {k: v for k, v in choice.items() if k not in ("index", "delta", "finish_reason")}
            if not out and not self.finish_sent:
                out.append(self._finish_chunk(self._top(chunk)))
        return out

    def close(self, estimate: Callable[[], dict[str, Any]]) -> list[dict[str, Any]]:
        """The chunks after the last event: a finish still owed, then the usage chunk."""
        if self.finished is None:
            raise EndedWithoutFinish("Stream ended before a finish_reason was received")
        out = []
        top: dict[str, Any] = {"system_fingerprint": self.fingerprint}
        if self.service_tier is not None:
            top["service_tier"] = self.service_tier
        if not self.finish_sent:
            out.append(self._finish_chunk(dict(top)))
        usage = self.usage if self.usage is not None else estimate()
        out.append(self._emit(top, [], usage=usage))
        return out

    def _carries_something(self, delta: Mapping[str, Any]) -> bool:
        content = delta.get("content")
        return (isinstance(content, str) and content != "") or any(
            delta.get(key) is not None for key in (*_CONTENT_KEYS, "reasoning")) or (
            not self.started and delta.get("role") is not None)

    def _guard_repetition(self) -> None:
        if len(self.contents) < 2:
            return
        last, before = self.contents[-1], self.contents[-2]
        if not isinstance(last, str) or len(last) <= 2:
            self.repeated = 1
            return
        self.repeated = self.repeated + 1 if last == before else 1
        if self.repeated >= self.repetition_limit:
            raise Repetition(last)

    def _top(self, chunk: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in chunk.items() if k not in ("id", "object", "created", "model", "choices", "usage")}

    def _emit(self, top: dict[str, Any], choices: list[dict[str, Any]], usage: Any = None) -> dict[str, Any]:
        out = {"id": self.last_id, "created": self.created, "model": self.model,
               "object": "chat.completion.chunk", **top, "choices": choices}
        if usage is not None:
            out["usage"] = usage
        self.contents.append(choices[0]["delta"].get("content") if choices else None)
        return out

    def _content_choice(self, choice: Mapping[str, Any], delta: Mapping[str, Any]) -> dict[str, Any]:
        out_delta = {k: v for k, v in delta.items() if k != "role"}
        if "reasoning" in out_delta:
            out_delta["reasoning_content"] = out_delta.pop("reasoning")
        if not self.started:
            out_delta["role"] = "assistant"
            self.started = True
        if out_delta.get("tool_calls"):
            self.tool_calls = True
            out_delta["tool_calls"] = [{**call, "type": call.get("type") or "function"}
                                       if isinstance(call, dict) else call for call in out_delta["tool_calls"]]
        if isinstance(out_delta.get("content"), str):
            self.texts.append(out_delta["content"])
        if isinstance(out_delta.get("reasoning_content"), str):
            self.thoughts.append(out_delta["reasoning_content"])
        extras = {k: v for k, v in choice.items() if k not in ("index", "delta", "finish_reason")}
        return {"finish_reason": None, "index": choice.get("index", 0), "delta": out_delta, **extras}

    def _finish_chunk(self, top: dict[str, Any]) -> dict[str, Any]:
        reason = self.finish_reason(self.finished or "stop")
        if reason == "stop" and self.tool_calls:
            reason = "tool_calls"
        self.finish_sent = True
        return self._emit(top, [{"finish_reason": reason, "index": 0, "delta": {}, **self.finish_choice}])
