"""A client span for every call to the provider, following OpenTelemetry's gen_ai conventions.

`TracedUpstream` wraps the app's `UpstreamClient`, so every round of every wire
format (the hidden rehydration rounds too) is one span, named `chat {model}`
(`embeddings {model}`, `text_completion {model}` for the passthrough routes),
and sends the span's `traceparent` to the provider. A stream's span ends at the
stream's terminal event (or when it fails or is closed), carrying its usage.
Prompts and answers are recorded only with `telemetry.capture_content`.
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, AsyncIterator, Callable, Mapping
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Tracer

from gateway.ops.tracing import PROPAGATOR, mark_failed
from gateway.upstream.seam import Api, UpstreamClient, UpstreamRequest, WrappedUpstream, close_stream
from gateway.wire import anthropic_messages, gemini, openai_responses

_MAX_TOKENS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_RESPONSES_TERMINAL = ("response.completed", "response.failed", "response.incomplete")


def provider_and_model(litellm_params: Mapping[str, Any]) -> tuple[str, str]:
    """(gen_ai.provider.name, gen_ai.request.model): `openai/gpt-4o` is openai's `gpt-4o`."""
    model = str(litellm_params.get("model", ""))
    prefix, _, rest = model.partition("/")
    provider = litellm_params.get("custom_llm_provider")
    if provider:
        return str(provider), rest if prefix == provider else model
    return (prefix, rest) if rest else ("openai", model)


def request_attributes(operation: str, api: str, request: UpstreamRequest) -> dict[str, Any]:
    provider, model = provider_and_model(request.litellm_params)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation, "gen_ai.provider.name": provider, "gen_ai.system": provider,
        "gen_ai.request.model": model, "gateway.model": request.alias, "gateway.upstream_api": api,
        "gateway.request_id": request.request_id,
    }
    body = request.body
    for key in _MAX_TOKENS:
        if isinstance(body.get(key), int):
            attributes["gen_ai.request.max_tokens"] = body[key]
            break
    for key in ("temperature", "top_p"):
        if isinstance(body.get(key), (int, float)) and not isinstance(body.get(key), bool):
            attributes[f"gen_ai.request.{key}"] = float(body[key])
    base = request.litellm_params.get("api_base") or request.litellm_params.get("base_url")
    if isinstance(base, str) and base:
        url = urlsplit(base)
        if url.hostname:
            attributes["server.address"] = url.hostname
            port = url.port or (443 if url.scheme == "https" else 80 if url.scheme == "http" else None)
            if port:
                attributes["server.port"] = port
    return attributes


def _input_messages(body: Mapping[str, Any]) -> list[Any]:
    system = body.get("system") or body.get("instructions")
    turns = body.get("messages") if "messages" in body else body.get("input")
    turns = turns if isinstance(turns, list) else [] if turns is None else [{"role": "user", "content": turns}]
    return ([{"role": "system", "content": system}] if system else []) + turns


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


class _Call:
    """One upstream call's span: what the answer says is added as it becomes known; ended once."""

    def __init__(self, span: Span, capture_content: bool) -> None:
        self.span = span
        self.capture_content = capture_content
        self.ended = False
        self.id: str | None = None
        self.model: str | None = None
        self.usage: Mapping[str, Any] | None = None  # Chat-shaped, as the run records usage
        self.finish_reasons: list[str] = []
        self.text: list[str] = []  # a stream's answer text, kept only when content is captured
        self.anthropic_usage: dict[str, Any] = {}  # a Messages stream's: message_start's, then message_delta's

    def answered(self, response: Mapping[str, Any], usage: Mapping[str, Any] | None, finish: list[Any],
                 output: Any) -> None:
        self.id = response.get("id") or self.id
        self.model = response.get("model") or self.model
        self.usage = usage or self.usage
        self.finish_reasons = [str(f) for f in finish if f] or self.finish_reasons
        if self.capture_content and output is not None:
            self.span.set_attribute("gen_ai.output.messages", _dump(output))

    def end(self, failure: BaseException | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        span = self.span
        if self.id:
            span.set_attribute("gen_ai.response.id", str(self.id))
        if self.model:
            span.set_attribute("gen_ai.response.model", str(self.model))
        if self.finish_reasons:
            span.set_attribute("gen_ai.response.finish_reasons", self.finish_reasons)
        if self.usage:
            prompt, completion = self.usage.get("prompt_tokens"), self.usage.get("completion_tokens")
            cached = (self.usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            written = self.usage.get("cache_creation_input_tokens")
            for key, value in (("gen_ai.usage.input_tokens", prompt), ("gen_ai.usage.output_tokens", completion),
                               ("gen_ai.usage.cache_read.input_tokens", cached),
                               ("gen_ai.usage.cache_creation.input_tokens", written)):
                if isinstance(value, int):
                    span.set_attribute(key, value)
        if self.text and self.capture_content:
            span.set_attribute("gen_ai.output.messages", _dump([{"role": "assistant", "content": "".join(self.text)}]))
        if failure is not None:
            mark_failed(span, failure)
        span.end()


# What each answer says of itself: (usage as the run records it, finish reasons, output for capture).
def _chat_answer(response: Mapping[str, Any]) -> tuple[Any, list[Any], Any]:
    choices = response.get("choices") or []
    return (response.get("usage"), [c.get("finish_reason") for c in choices],
            [c.get("message") or c.get("text") for c in choices])


def _messages_answer(response: Mapping[str, Any]) -> tuple[Any, list[Any], Any]:
    return (anthropic_messages.run_usage(response.get("usage")), [response.get("stop_reason")],
            [{"role": "assistant", "content": response.get("content")}])


def _responses_answer(response: Mapping[str, Any]) -> tuple[Any, list[Any], Any]:
    return openai_responses.run_usage(response.get("usage")), [response.get("status")], response.get("output")


def _gemini_answer(response: Mapping[str, Any]) -> tuple[Any, list[Any], Any]:
    candidates = [c for c in response.get("candidates") or [] if isinstance(c, dict)]
    return (gemini.run_usage(response.get("usageMetadata")), [c.get("finishReason") for c in candidates],
            [c.get("content") for c in candidates])


# What each stream's events add; True at the event that ends the answer.
def _chat_event(call: _Call, chunk: Mapping[str, Any]) -> bool:
    call.answered(chunk, chunk.get("usage"), [c.get("finish_reason") for c in chunk.get("choices") or []], None)
    if call.capture_content:
        call.text += [d["content"] for c in chunk.get("choices") or []
                      if isinstance(d := c.get("delta") or {}, dict) and isinstance(d.get("content"), str)]
    return False  # the stream's own end ends it


def _messages_event(call: _Call, event: Mapping[str, Any]) -> bool:
    kind = event.get("type")
    if kind == "message_start":
        message = event.get("message") or {}
        call.answered(message, None, [], None)
        call.anthropic_usage.update(message.get("usage") or {})
    elif kind == "message_delta":
        call.anthropic_usage.update(event.get("usage") or {})
        call.answered({}, anthropic_messages.run_usage(call.anthropic_usage),
                      [(event.get("delta") or {}).get("stop_reason")], None)
    elif kind == "content_block_delta" and call.capture_content:
        text = (event.get("delta") or {}).get("text")
        if isinstance(text, str):
            call.text.append(text)
    return kind == "message_stop"


def _responses_event(call: _Call, event: Mapping[str, Any]) -> bool:
    kind = event.get("type")
    if kind == "response.created":
        call.answered(event.get("response") or {}, None, [], None)
    elif kind in _RESPONSES_TERMINAL:
        call.answered(event.get("response") or {}, *_responses_answer(event.get("response") or {}))
        return True
    elif kind == "response.output_text.delta" and call.capture_content and isinstance(event.get("delta"), str):
        call.text.append(event["delta"])
    return False


def _gemini_event(call: _Call, chunk: Mapping[str, Any]) -> bool:
    usage, reasons, _ = _gemini_answer(chunk)
    call.answered(chunk, usage, [r for r in reasons if r], None)
    if call.capture_content:
        call.text += [p["text"] for p in gemini.candidate_parts(chunk) if isinstance(p.get("text"), str)]
    return False  # the stream's own end ends it


# Each API's span: (operation, what an answer says of itself, what a stream event adds).
_READERS: dict[str, tuple[str, Callable[[Mapping[str, Any]], tuple[Any, list[Any], Any]] | None,
                          Callable[[_Call, Mapping[str, Any]], bool] | None]] = {
    "chat": ("chat", _chat_answer, _chat_event),
    "messages": ("chat", _messages_answer, _messages_event),
    "responses": ("chat", _responses_answer, _responses_event),
    "generate_content": ("chat", _gemini_answer, _gemini_event),
    "embeddings": ("embeddings", None, None),
    "completions": ("text_completion", _chat_answer, _chat_event),
}


class TracedUpstream(WrappedUpstream):
    """An `UpstreamClient` whose calls are client spans; everything else is the wrapped client's."""

    def __init__(self, inner: UpstreamClient, tracer: Tracer, capture_content: bool) -> None:
        super().__init__(inner)
        self.tracer = tracer
        self.capture_content = capture_content

    def _open(self, operation: str, api: str, request: UpstreamRequest) -> tuple[_Call, UpstreamRequest]:
        attributes = request_attributes(operation, api, request)
        if self.capture_content:
            attributes["gen_ai.input.messages"] = _dump(_input_messages(request.body))
        span = self.tracer.start_span(f"{operation} {attributes['gen_ai.request.model']}", kind=SpanKind.CLIENT,
                                      attributes=attributes)
        headers: dict[str, str] = {}
        PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
        return _Call(span, self.capture_content), replace(request, extra_headers={**request.extra_headers, **headers})

    async def call(self, api: Api, request: UpstreamRequest) -> dict[str, Any]:
        operation, read, _ = _READERS[api]
        call, request = self._open(operation, api, request)
        try:
            response = await self.inner.call(api, request)
        except BaseException as exc:
            call.end(exc)
            raise
        if read is not None:
            call.answered(response, *read(response))
        else:
            call.answered(response, response.get("usage"), [], None)
        call.end()
        return response

    async def stream(self, api: Api, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        operation, _, read = _READERS[api]
        if read is None:
            raise ValueError(f"{api} answers do not stream")
        call, request = self._open(operation, api, request)
        events = self.inner.stream(api, request)
        try:
            async for event in events:
                if read(call, event):
                    call.end()  # the answer is whole, whether or not the reader goes on
                yield event
        except BaseException as exc:
            # closed before its end (GeneratorExit: the client went away, or a reader stopped early)
            call.end(None if call.ended else exc)
            raise
        finally:
            call.end()
            await close_stream(events)
