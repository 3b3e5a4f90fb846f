"""The one module that imports LiteLLM: `UpstreamClient` over `litellm.acompletion`.

LiteLLM is configured per call (no global callback lists, no module flags
beyond the offline environment set before import), so concurrent requests
for different tenants and models cannot affect each other.

Chat completions for a deployment that speaks OpenAI's wire format skip
`litellm.acompletion`'s per-call machinery (issue 11): `DirectChat`
(gateway/direct_chat.py) posts them over a pooled HTTP client, while LiteLLM
still decides everything about the exchange here: eligibility (`direct_route`),
the body and headers (`openai_request`, LiteLLM's own transformation functions
in `litellm.completion`'s order), the reading of answers and the wording of
failures (`OpenAIDirectCodec`). Both paths then get the same post-processing
(`_completion_out`, `_chunk_out`), which also removes LiteLLM's artefacts, so
clients get OpenAI's shape either way. GATEWAY_DIRECT_TRANSPORT=0 turns it off.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Mapping

from policies.tokens import use_bundled_encodings

# Before LiteLLM is imported: no price-map download, tokenizers from its own folder.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
use_bundled_encodings()

import litellm  # noqa: E402

# Anthropic-format requests to OpenAI-wire deployments go over chat completions, which every
# OpenAI-compatible server has (LiteLLM would otherwise pick the Responses API for them).
litellm.use_chat_completions_url_for_anthropic_messages = True

import httpx  # noqa: E402
import openai  # noqa: E402
from litellm import main as litellm_main  # noqa: E402
from litellm.litellm_core_utils.exception_mapping_utils import exception_type  # noqa: E402
from litellm.litellm_core_utils.llm_response_utils.convert_dict_to_response import (  # noqa: E402
    convert_to_model_response_object,
)
from litellm.litellm_core_utils.core_helpers import map_finish_reason  # noqa: E402
from litellm.llms.openai.chat.gpt_transformation import OpenAIGPTConfig, OpenAIUnknownModelConfig  # noqa: E402
from litellm.llms.openai.common_utils import OpenAIError, upstream_error_response  # noqa: E402
from litellm.llms.custom_httpx.http_handler import get_ssl_configuration  # noqa: E402

from gateway.direct_chat import (  # noqa: E402
    DirectCall,
    DirectChat,
    EndedWithoutFinish,
    ErrorEvent,
    Repetition,
)
from gateway.errors import (  # noqa: E402
    UpstreamError,
    UpstreamInvalidResponse,
    UpstreamTimeout,
    UpstreamUnavailable,
    upstream_error_for_status,
)
from gateway.upstream import Prices, UpstreamRequest  # noqa: E402

# OpenAI chat fields LiteLLM takes as named arguments; any other body field
# goes to the provider untouched through `extra_body`.
_NAMED_PARAMS = frozenset(
    {
        "messages", "tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p", "n",
        "stop", "max_tokens", "max_completion_tokens", "presence_penalty", "frequency_penalty",
        "logit_bias", "user", "response_format", "seed", "logprobs", "top_logprobs",
        "stream_options", "functions", "function_call", "modalities", "prediction", "audio",
        "reasoning_effort", "verbosity", "safety_identifier", "service_tier", "store",
        "prompt_cache_key", "prompt_cache_retention", "web_search_options", "metadata",
    }
)
# Arguments of `litellm.acompletion` that steer the call itself.
_CALL_OPTIONS = frozenset({"max_retries", "extra_headers", "stream", "timeout", "api_key", "api_base", "base_url"})
# The Anthropic Messages fields passed to `litellm.anthropic.messages.acreate`. Only these: a
# body key must never reach LiteLLM as a call option (api_base, api_key, credentials), and
# LiteLLM's native Anthropic path keeps only Anthropic's documented fields anyway.
_MESSAGES_PARAMS = frozenset(
    {
        "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "tools",
        "tool_choice", "thinking", "metadata", "context_management", "output_format", "output_config",
        "service_tier", "container", "mcp_servers", "inference_geo", "speed",
    }
)
# The Responses fields `litellm.aresponses` takes by name; any other body field goes to the
# provider in `extra_body`, never as a call option.
_RESPONSES_PARAMS = frozenset(
    {
        "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "reasoning", "include",
        "prompt_cache_key", "prompt_cache_retention", "store", "metadata", "max_output_tokens", "temperature",
        "top_p", "truncation", "user", "service_tier", "safety_identifier", "max_tool_calls", "top_logprobs",
    }
)
# Config keys that describe pricing for us, not parameters for the provider.
_PRICING_KEYS = frozenset(
    {"input_cost_per_token", "output_cost_per_token", "cache_read_input_token_cost",
     "cache_creation_input_token_cost"}
)


def _drop_none(value: Any, keep: frozenset[str] = frozenset()) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v, keep) for k, v in value.items() if v is not None or k in keep}
    if isinstance(value, list):
        return [_drop_none(v, keep) for v in value]
    return value


_KEEP_NULL = frozenset({"content", "finish_reason"})
_KEEP_NULL_IN_CHUNKS = frozenset({"finish_reason"})


def _completion_out(response: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion in OpenAI's shape: no nulls OpenAI's schema does not require, and the fields
    LiteLLM files under `provider_specific_fields` back where the provider sent them."""
    out = _drop_none(response, _KEEP_NULL)
    out["choices"] = [_unfiled(choice) for choice in out.get("choices") or []]
    return out


def _unfiled(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    choice = _with_provider_fields(choice)
    if isinstance(choice.get("message"), dict):
        choice["message"] = _with_provider_fields(choice["message"])
    return choice


def _with_provider_fields(item: dict[str, Any]) -> dict[str, Any]:
    fields = item.get("provider_specific_fields")
    out = {k: v for k, v in item.items() if k != "provider_specific_fields"}
    for key, value in (fields or {}).items() if isinstance(fields, dict) else ():
        out.setdefault(key, value)
    return out


def _chunk_out(chunk: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion.chunk in OpenAI's shape: no nulls but `finish_reason` (a delta's null content
    is LiteLLM's), and no completion-token split LiteLLM estimated itself."""
    out = _drop_none(chunk, _KEEP_NULL_IN_CHUNKS)
    usage = out.get("usage")
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    if isinstance(details, dict) and "text_tokens" in details:
        kept = {k: v for k, v in details.items() if k not in ("text_tokens", "reasoning_tokens")}
        out["usage"] = {k: v for k, v in usage.items() if k != "completion_tokens_details"}
        if kept:
            out["usage"]["completion_tokens_details"] = kept
    return out


def _json_bytes(body: Mapping[str, Any]) -> bytes:
    """A body serialised as the openai SDK serialises it."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


_OPENAI_WIRE = frozenset({"openai", "custom_openai", "text-completion-openai", *litellm.openai_compatible_providers})


@functools.lru_cache(maxsize=256)
def _wire_params(model: str, custom_provider: str | None) -> tuple[frozenset[str], bool]:
    """The OpenAI params LiteLLM maps for this model, and whether it speaks OpenAI's wire format."""
    try:
        _model, provider, _key, _base = litellm.get_llm_provider(model, custom_llm_provider=custom_provider)
        supported = litellm.get_supported_openai_params(model=_model, custom_llm_provider=provider) or []
    except Exception:  # an unknown provider: let LiteLLM decide on every param
        return _NAMED_PARAMS, False
    # LiteLLM lists some of its own call options among the "params"; a client's
    # body must never set those (retries, upstream headers), only send them on.
    return (frozenset(supported) - _CALL_OPTIONS) | {"messages"}, provider in _OPENAI_WIRE


class LiteLLMUpstream:
    """Calls providers through `litellm.acompletion`, one call per request; chat completions for an
    OpenAI-compatible deployment go over `DirectChat` instead, with LiteLLM deciding what is sent.

    `direct_transport=None` reads GATEWAY_DIRECT_TRANSPORT (on unless "0", "false", "no" or "off").
    """

    def __init__(self, direct_transport: bool | None = None) -> None:
        wanted = _direct_wanted() if direct_transport is None else direct_transport
        self._direct = DirectChat(OpenAIDirectCodec(), verify=get_ssl_configuration()) if wanted else None

    async def aclose(self) -> None:
        """Close the direct transport's connection pool."""
        if self._direct is not None:
            await self._direct.aclose()

    def _direct_call(self, request: UpstreamRequest, stream: bool) -> DirectCall | None:
        """The direct exchange LiteLLM would make for a chat request, or None to let LiteLLM make it."""
        if self._direct is None:
            return None
        route = direct_route(request.litellm_params)
        if route is None:
            return None
        try:
            built = openai_request(route, self._kwargs(request, stream), stream)
        except Exception:  # a request LiteLLM refuses: its own path reports it
            return None
        if built is None:
            return None
        body, extra_headers = built
        headers = {"Authorization": f"Bearer {route.api_key}", "Content-Type": "application/json",
                   "Accept": "application/json", **extra_headers}
        return DirectCall(url=route.url, headers=headers, body=_json_bytes(body), timeout=request.timeout_seconds,
                          model=route.model, request=request)

    @staticmethod
    def _call_kwargs(request: UpstreamRequest, by_name: Callable[[str], bool], *, stream: bool | None = None,
                     unnamed: str = "extra_body") -> dict[str, Any]:
        """A LiteLLM call's arguments: the deployment's litellm_params, the body's fields LiteLLM takes by
        name (`by_name`), and the other body fields in `extra_body`, sent to the provider as the client sent
        them (`unnamed="drop"`: left out). A body field never becomes a call option."""
        params = {k: v for k, v in request.litellm_params.items() if k not in _PRICING_KEYS}
        kwargs: dict[str, Any] = {"max_retries": 0, **params}
        extra_body: dict[str, Any] = dict(kwargs.pop("extra_body", None) or {})
        for key, value in request.body.items():
            if by_name(key):
                kwargs[key] = value
            elif unnamed == "extra_body":
                extra_body[key] = value
        if extra_body:
            kwargs["extra_body"] = extra_body
        kwargs["timeout"] = request.timeout_seconds
        if stream is not None:
            kwargs["stream"] = stream
        if request.extra_headers:
            kwargs["extra_headers"] = {**(kwargs.get("extra_headers") or {}), **request.extra_headers}
        return kwargs

    def _kwargs(self, request: UpstreamRequest, stream: bool) -> dict[str, Any]:
        params = request.litellm_params
        supported, openai_wire = _wire_params(str(params["model"]), params.get("custom_llm_provider"))
        # LiteLLM maps a supported param for the provider (or refuses it); anything else goes as sent.
        kwargs = self._call_kwargs(
            request, lambda key: key in supported or (key in _NAMED_PARAMS and not openai_wire),
            stream=True if stream else None)
        if stream:
            # Usage is always asked for, so the run is recorded; the caller
            # passes the usage chunk on only if the client asked for it.
            kwargs["stream_options"] = {**(kwargs.get("stream_options") or {}), "include_usage": True}
        return kwargs

    def _messages_kwargs(self, request: UpstreamRequest, stream: bool) -> dict[str, Any]:
        return self._call_kwargs(request, _MESSAGES_PARAMS.__contains__, stream=stream, unnamed="drop")

    async def messages(self, request: UpstreamRequest) -> dict[str, Any]:
        try:
            response = await litellm.anthropic.messages.acreate(**self._messages_kwargs(request, stream=False))
        except Exception as exc:
            raise _map_error(exc) from exc
        body = response if isinstance(response, dict) else response.model_dump()
        if not isinstance(body.get("content"), list):
            raise UpstreamInvalidResponse("upstream: the answer is not a message (no content blocks)")
        return body

    async def stream_messages(self, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        try:
            stream = await litellm.anthropic.messages.acreate(**self._messages_kwargs(request, stream=True))
            if not hasattr(stream, "__aiter__"):  # a whole message (LiteLLM's mock answers so): its events
                for event in message_events(stream if isinstance(stream, dict) else stream.model_dump()):
                    yield event
                return
            frames = SseFrames()
            async for chunk in stream:
                for event in frames.feed(chunk):
                    if event.get("type") == "error":
                        raise _event_error(event)
                    yield event
        except UpstreamError:
            raise
        except Exception as exc:
            raise _map_error(exc) from exc

    def _responses_kwargs(self, request: UpstreamRequest, stream: bool) -> dict[str, Any]:
        return self._call_kwargs(request, _RESPONSES_PARAMS.__contains__, stream=stream)

    async def responses(self, request: UpstreamRequest) -> dict[str, Any]:
        try:
            response = await litellm.aresponses(**self._responses_kwargs(request, stream=False))
        except Exception as exc:
            raise _map_error(exc) from exc
        body = response if isinstance(response, dict) else response.model_dump(warnings=False)
        if not isinstance(body.get("output"), list):
            raise UpstreamInvalidResponse("upstream: the answer is not a response (no output items)")
        return _drop_none(body, _KEEP_NULL)

    async def stream_responses(self, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        try:
            stream = await litellm.aresponses(**self._responses_kwargs(request, stream=True))
            async for event in stream:
                data = event if isinstance(event, dict) else event.model_dump(warnings=False)
                if data.get("type") == "error":
                    raise upstream_error_for_status(502, f"upstream: {data.get('message') or data}")
                yield _drop_none(data, _KEEP_NULL)
        except UpstreamError:
            raise
        except Exception as exc:
            raise _map_error(exc) from exc

    def _plain_kwargs(self, request: UpstreamRequest) -> dict[str, Any]:
        """Embeddings and completions: the body's fields by name, except anything LiteLLM would take as a
        call option (those go to the provider in `extra_body`)."""
        params = request.litellm_params
        return self._call_kwargs(request, lambda key: not (
            key in _CALL_OPTIONS or key in params or key.startswith(("api_", "aws_", "vertex_", "litellm_"))))

    async def embeddings(self, request: UpstreamRequest) -> dict[str, Any]:
        try:
            response = await litellm.aembedding(**self._plain_kwargs(request))
        except Exception as exc:
            raise _map_error(exc) from exc
        return _drop_none(response.model_dump(), _KEEP_NULL)

    async def text_completion(self, request: UpstreamRequest) -> dict[str, Any]:
        try:
            response = await litellm.atext_completion(**self._plain_kwargs(request))
        except Exception as exc:
            raise _map_error(exc) from exc
        return _drop_none(response.model_dump(), _KEEP_NULL)

    async def stream_text_completion(self, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        try:
            chunks = await litellm.atext_completion(**self._plain_kwargs(request), stream=True)
            async for chunk in chunks:
                yield _drop_none(chunk if isinstance(chunk, dict) else chunk.model_dump(), _KEEP_NULL)
        except UpstreamError:
            raise
        except Exception as exc:
            raise _map_error(exc) from exc

    async def warm_up(self) -> None:
        """Load what LiteLLM loads on its first call and first stream (offline: a mock answer)."""
        messages = [{"role": "user", "content": "warm up"}]
        await litellm.acompletion(model="openai/warm-up", messages=messages, mock_response="ok", api_key="-")
        stream = await litellm.acompletion(model="openai/warm-up", messages=messages, mock_response="ok",
                                           api_key="-", stream=True)
        async for _ in stream:
            pass

    async def complete(self, request: UpstreamRequest) -> dict[str, Any]:
        call = self._direct_call(request, stream=False)
        if call is not None and self._direct is not None:
            return check_completion(_completion_out(await self._direct.complete(call)))
        try:
            response = await litellm.acompletion(**self._kwargs(request, stream=False))
        except Exception as exc:  # LiteLLM raises many types; map them once, here
            raise _map_error(exc) from exc
        return check_completion(_completion_out(response.model_dump()))

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        call = self._direct_call(request, stream=True)
        if call is not None and self._direct is not None:
            async for chunk in self._direct.stream(call):
                yield _chunk_out(chunk)
            return
        try:
            chunks = await litellm.acompletion(**self._kwargs(request, stream=True))
            received = 0
            async for chunk in chunks:
                received += 1
                out = _chunk_out(chunk.model_dump())
                if _finishes(out) and not _provider_finished(chunks):
                    # LiteLLM makes up a closing chunk when the body held no events at all
                    # (a JSON or HTML answer to a streaming request): that is no completion.
                    raise UpstreamInvalidResponse(
                        f"upstream: the stream held no completion events ({_content_type(chunks)})")
                yield out
            if not received:
                raise UpstreamInvalidResponse("upstream: the stream ended before any completion event")
        except UpstreamError:
            raise
        except Exception as exc:
            raise _map_error(exc) from exc

    def prices(self, litellm_params: Mapping[str, Any]) -> Prices | None:
        if "input_cost_per_token" in litellm_params:
            price_in = float(litellm_params["input_cost_per_token"])
            return Prices(
                input=price_in,
                output=float(litellm_params.get("output_cost_per_token", 0.0)),
                cache_read=float(litellm_params.get("cache_read_input_token_cost", price_in)),
                cache_write=float(litellm_params.get("cache_creation_input_token_cost", price_in)),
            )
        return _map_prices(str(litellm_params["model"]))

    def cost_usd(self, litellm_params: Mapping[str, Any], usage: Mapping[str, Any]) -> float | None:
        prices = self.prices(litellm_params)
        if prices is None:
            return None
        details = usage.get("prompt_tokens_details") or {}
        return prices.cost(
            prompt=int(usage.get("prompt_tokens") or 0),
            completion=int(usage.get("completion_tokens") or 0),
            cached=int(details.get("cached_tokens") or 0),
            cache_write=int(usage.get("cache_creation_input_tokens") or 0),
        )


class SseFrames:
    """Server-sent event frames from the byte chunks LiteLLM yields (frames may span chunks)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: Any) -> list[dict[str, Any]]:
        if isinstance(chunk, dict):  # some adapters yield parsed events
            return [chunk]
        self._buffer += chunk.encode() if isinstance(chunk, str) else bytes(chunk)
        events = []
        while b"\n\n" in self._buffer:
            frame, self._buffer = self._buffer.split(b"\n\n", 1)
            data = b"".join(line[5:].strip() for line in frame.split(b"\n") if line.startswith(b"data:"))
            if not data or data == b"[DONE]":
                continue
            try:
                event = json.loads(data)
            except ValueError as exc:
                raise UpstreamInvalidResponse(f"upstream: a stream event is not JSON: {data[:200]!r}") from exc
            if isinstance(event, dict):
                events.append(event)
        return events


def message_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The Anthropic event sequence of a complete message (for an upstream that answered one whole)."""
    usage = message.get("usage") or {}
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message.get("content") or []):
        kind = block.get("type")
        if kind == "text":
            opening, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block.get("text", "")}
        elif kind == "tool_use":
            opening = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.get("input") or {})}
        else:
            opening, delta = block, None
        events.append({"type": "content_block_start", "index": index, "content_block": opening})
        if delta is not None:
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        events.append({"type": "content_block_stop", "index": index})
    events.append({"type": "message_delta", "delta": {"stop_reason": message.get("stop_reason"),
                                                      "stop_sequence": message.get("stop_sequence")},
                   "usage": {"output_tokens": usage.get("output_tokens", 0)}})
    events.append({"type": "message_stop"})
    return events


def _event_error(event: dict[str, Any]) -> UpstreamError:
    error = event.get("error") or {}
    kind, message = error.get("type"), f"upstream: {error.get('message') or 'error event'}"
    status = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
              "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429,
              "overloaded_error": 529}.get(str(kind), 502)
    return upstream_error_for_status(status, message)


def check_completion(response: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion with at least one choice holding a message, or UpstreamInvalidResponse."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not all(
            isinstance(c, dict) and isinstance(c.get("message"), dict) for c in choices):
        raise UpstreamInvalidResponse("upstream: the answer is not a chat completion (no choices with a message)")
    return response


def _finishes(chunk: dict[str, Any]) -> bool:
    return any(isinstance(c, dict) and c.get("finish_reason") for c in chunk.get("choices") or [])


def _provider_finished(stream: Any) -> bool:
    """Whether the provider itself sent a finish (LiteLLM's stream wrapper keeps track)."""
    if getattr(stream, "is_mock", False):
        return True
    return bool(getattr(stream, "received_finish_reason", None) or getattr(stream, "intermittent_finish_reason", None)
                or getattr(stream, "received_any_finish_reason", False))


def _content_type(stream: Any) -> str:
    headers = (getattr(stream, "_hidden_params", None) or {}).get("additional_headers") or {}
    return f"content-type {headers.get('llm_provider-content-type', 'unknown')}"


@functools.lru_cache(maxsize=256)
def _map_prices(model: str) -> Prices | None:
    try:
        info = litellm.get_model_info(model)
    except Exception:  # a model LiteLLM has no price for
        return None
    price_in = info.get("input_cost_per_token")
    if price_in is None:
        return None
    return Prices(
        input=float(price_in),
        output=float(info.get("output_cost_per_token") or 0.0),
        cache_read=float(info.get("cache_read_input_token_cost") or price_in),
        cache_write=float(info.get("cache_creation_input_token_cost") or price_in),
    )


_TIMEOUT_CAUSES = frozenset({"APITimeoutError", "ReadTimeout", "ConnectTimeout", "WriteTimeout",
                             "PoolTimeout", "ServerTimeoutError", "TimeoutError"})
_CONNECTION_CAUSES = frozenset({"APIConnectionError", "ConnectError", "ClientConnectorError",
                                "ClientConnectionError", "ServerDisconnectedError", "RemoteProtocolError"})


def _root_causes(exc: BaseException) -> list[str]:
    """Class names along the cause chain: LiteLLM reports a refused connection as a 500."""
    names, seen = [], set()
    current: BaseException | None = exc.__cause__ or exc.__context__
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names.append(type(current).__name__)
        current = current.__cause__ or current.__context__
    return names


def _map_error(exc: Exception) -> UpstreamError:
    message = f"upstream: {getattr(exc, 'message', None) or exc}"
    causes = _root_causes(exc)
    if isinstance(exc, litellm.Timeout) or _TIMEOUT_CAUSES.intersection(causes):
        return UpstreamTimeout(message)
    if _CONNECTION_CAUSES.intersection(causes):
        return UpstreamUnavailable(message)
    status = getattr(exc, "status_code", None)
    headers: dict[str, str] = {}
    response = getattr(exc, "response", None)
    retry_after = getattr(getattr(response, "headers", None), "get", lambda _k: None)("retry-after") or (
        getattr(exc, "litellm_response_headers", None) or {}).get("retry-after")
    if retry_after:
        headers["retry-after"] = str(retry_after)
    if isinstance(exc, litellm.APIConnectionError) or not isinstance(status, int):
        return UpstreamUnavailable(message, headers=headers)
    if status == 500 and getattr(exc, "litellm_response_headers", None) is None:
        # LiteLLM reports a 200 it could not read (truncated JSON, HTML, no choices) as its own 500;
        # a real upstream 500 carries the upstream's headers.
        detail = message.removeprefix("upstream: ")
        return UpstreamInvalidResponse(f"upstream: the answer is not a chat completion: {detail}")
    return upstream_error_for_status(status, message, headers)


# --------------------------------------------------------------------------- direct transport (issue 11)

# litellm_params a direct deployment may hold: anything else is something LiteLLM would act on.
_DIRECT_KEYS = frozenset({"model", "api_base", "api_key", "extra_headers", "timeout"}) | _PRICING_KEYS
# The chat configs whose transformation is the plain OpenAI one (o-series, gpt-5, audio, OpenAI-like
# providers rewrite params or messages on their own).
_DIRECT_CONFIGS = (OpenAIGPTConfig, OpenAIUnknownModelConfig)
_COMPLETION_ARGS = frozenset(inspect.signature(litellm_main.completion).parameters)
_SDK_OPTIONS = ("extra_headers", "extra_query", "extra_body")


def _direct_wanted() -> bool:
    return os.environ.get("GATEWAY_DIRECT_TRANSPORT", "1").strip().lower() not in ("0", "false", "no", "off")


def _litellm_acts_globally() -> bool:
    """Module settings or environment under which LiteLLM would change an OpenAI request on its own."""
    return bool(
        litellm.api_base or litellm.headers or litellm.proxy_auth or litellm.model_alias_map
        or litellm.model_fallbacks or litellm.drop_params or litellm.modify_params or litellm.cache
        or litellm.enable_preview_features or litellm.enable_anthropic_prompt_caching
        or litellm.add_function_to_prompt or litellm.openai_system_messages_first or litellm.organization
        or litellm.route_all_chat_openai_to_responses or litellm.aclient_session or litellm.callbacks
        or litellm.OpenAIConfig.get_config()
        or any(os.environ.get(name) for name in ("OPENAI_ORGANIZATION", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID",
                                                  "EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER")))


@dataclass(frozen=True)
class _DirectRoute:
    """What LiteLLM resolved for a deployment that qualifies for the direct transport."""

    model: str  # as the provider knows it
    provider: str
    api_base: str
    api_key: str
    url: str
    config: Any  # the OpenAI chat config LiteLLM uses for the model


def direct_route(litellm_params: Mapping[str, Any]) -> _DirectRoute | None:
    """The direct route of a deployment, or None when LiteLLM must make the call itself."""
    if not _DIRECT_KEYS.issuperset(litellm_params):
        return None
    api_base, api_key = litellm_params.get("api_base"), litellm_params.get("api_key")
    extra_headers = litellm_params.get("extra_headers") or {}
    if not (isinstance(api_base, str) and api_base and isinstance(api_key, str) and api_key
            and isinstance(extra_headers, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in extra_headers.items())):
        return None
    if _litellm_acts_globally():
        return None
    return _resolve_direct_route(str(litellm_params["model"]), api_base, api_key)


@functools.lru_cache(maxsize=256)
def _resolve_direct_route(model: str, api_base: str, api_key: str) -> _DirectRoute | None:
    try:
        name, provider, _key, base = litellm.get_llm_provider(model, api_base=api_base, api_key=api_key)
        if provider not in ("openai", "custom_openai"):
            return None
        config = litellm.ProviderConfigManager.get_provider_chat_config(
            model=name, provider=litellm.LlmProviders(provider))
        if type(config) not in _DIRECT_CONFIGS:
            return None
        base = base or api_base
        mode, bridged = litellm_main.responses_api_bridge_check(
            model=name, custom_llm_provider=provider, api_base=base, deployment_model_info={})
        if mode.get("mode") == "responses" or bridged != name:
            return None
        if litellm_main.get_provider_affinity_header(base) is not None:
            return None
    except Exception:  # whatever LiteLLM cannot resolve, it reports itself on its own path
        return None
    return _DirectRoute(model=name, provider=provider, api_base=base, api_key=api_key,
                        url=f"{base.rstrip('/')}/chat/completions", config=config)


def openai_request(route: _DirectRoute, kwargs: Mapping[str, Any],
                   stream: bool) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The body and extra headers LiteLLM would send for one `litellm.acompletion(**kwargs)` call to an
    OpenAI deployment, built by LiteLLM's own functions in the order `litellm.completion` and its OpenAI
    handler apply them; None where that call would take a route of its own (MCP tools, the Responses
    bridge, several streamed choices)."""
    named = {k: v for k, v in kwargs.items() if k in _COMPLETION_ARGS}
    unnamed = {k: v for k, v in kwargs.items() if k not in _COMPLETION_ARGS}
    tools = litellm_main.validate_and_fix_openai_tools(tools=named.get("tools"))
    if (tools and litellm_main.may_name_litellm_mcp_gateway(tools)) or (stream and (named.get("n") or 1) > 1):
        return None
    if not _stays_on_chat(route, named.get("web_search_options")):
        return None
    messages, named["tools"] = _openai_messages(route, kwargs["model"], named, tools)
    optional_params, effort = _optional_params(route, named, unnamed, messages)
    readable = litellm_main._messages_readable_by_model(
        messages=messages, model=route.model, custom_llm_provider=route.provider, model_info=None, base_model=None,
        drop_params=False, ensure_alternating_roles=None, user_continue_message=None, assistant_continue_message=None)
    if readable is not None:
        messages = list(readable)
    if not _stays_on_chat(route, named.get("web_search_options"), named["tools"], effort, optional_params):
        return None
    return _wire_body(route, messages, optional_params, dict(kwargs.get("extra_headers") or {}), stream)


def _stays_on_chat(route: _DirectRoute, web_search_options: Any, tools: Any = None, effort: Any = None,
                   optional_params: Mapping[str, Any] | None = None) -> bool:
    """Whether LiteLLM keeps the call on chat completions (it bridges some to the Responses API)."""
    bridge = {} if optional_params is None else {
        "tools": tools, "reasoning_summary": litellm_main.peek_reasoning_summary_aliases(optional_params),
        "reasoning_effort": litellm_main.bridge_reasoning_effort(effort, optional_params.get("extra_body"))}
    if web_search_options is None and not any(value is not None for value in bridge.values()):
        return True  # the deployment's own check (`_resolve_direct_route`) asked exactly this
    mode, _ = litellm_main.responses_api_bridge_check(
        model=route.model, custom_llm_provider=route.provider, web_search_options=web_search_options,
        api_base=route.api_base, deployment_model_info={}, **bridge)
    return mode.get("mode") != "responses"


def _openai_messages(route: _DirectRoute, model: str, named: dict[str, Any],
                     tools: Any) -> tuple[list[Any], Any]:
    """Messages and tools as `litellm.completion` prepares them before mapping params (it also validates
    `tool_choice`, `stop` and `thinking`, which `_optional_params` reads back from `named`)."""
    m, provider, config = litellm_main, route.provider, route.config
    messages = m.validate_and_fix_openai_messages(messages=named.get("messages") or [])
    named["tool_choice"] = m.validate_chat_completion_tool_choice(tool_choice=named.get("tool_choice"), model=model)
    named["stop"] = m.validate_openai_optional_params(stop=named.get("stop"))
    named["thinking"] = m.validate_and_fix_thinking_param(thinking=named.get("thinking"))
    messages = m.get_completion_messages(messages=messages, ensure_alternating_roles=False,
                                         user_continue_message=None, assistant_continue_message=None)
    tools = m._drop_anthropic_only_tool_keys(tools=tools)
    m.raise_if_allowed_tools_tool_choice_unsupported(tool_choice=named["tool_choice"], custom_llm_provider=provider,
                                                     model=route.model)
    m.raise_if_hosted_tool_choice_unsupported(tool_choice=named["tool_choice"], custom_llm_provider=provider,
                                              model=route.model)
    messages = m.update_messages_with_model_file_ids(messages=messages, model_id=None, model_file_id_mapping={})
    messages = list(config.translate_developer_role_to_system_role(
        messages=messages, model=route.model, custom_llm_provider=provider, api_base=route.api_base, model_info={}))
    history = m._history_without_unanswered_tool_search_calls(messages, provider, config)
    return (messages if history is None else list(history)), tools


_OPTIONAL_PARAM_ARGS = (
    "functions", "function_call", "temperature", "top_p", "n", "stream", "stream_options", "stop", "max_tokens",
    "max_completion_tokens", "modalities", "prediction", "audio", "presence_penalty", "frequency_penalty",
    "logit_bias", "user", "response_format", "seed", "tools", "tool_choice", "logprobs", "top_logprobs",
    "api_version", "parallel_tool_calls", "verbosity", "web_search_options", "include_server_side_tool_invocations",
    "safety_identifier", "service_tier", "store", "prompt_cache_key", "prompt_cache_retention",
)


def _optional_params(route: _DirectRoute, named: Mapping[str, Any], unnamed: Mapping[str, Any],
                     messages: list[Any]) -> tuple[dict[str, Any], Any]:
    """`get_optional_params` as `litellm.completion` calls it, and the reasoning effort it resolved."""
    m, model, provider, config = litellm_main, route.model, route.provider, route.config
    non_default = m.get_non_default_completion_params(kwargs=unnamed)
    requested_output = m.as_str_mapping(non_default.get("output_config"))
    reasoning = m.resolve_chat_reasoning(named.get("reasoning_effort"), named.get("thinking"), requested_output,
                                         model=model, custom_llm_provider=provider, deployment_model_info=None,
                                         model_group=None, drop_params=False)
    provider_params = non_default if reasoning.output_config is requested_output else {
        **{k: v for k, v in non_default.items() if k != "output_config"},
        **({"output_config": reasoning.output_config} if reasoning.output_config is not None else {})}
    allowed = ["reasoning_effort"] if m.reasoning_effort_needs_allowing(
        reasoning.effort, model=model, custom_llm_provider=provider, base_model=None) else None
    effort = m.reasoning_effort_with_summary_alias(
        reasoning.effort.value, provider_params, accepts_summary=config.accepts_reasoning_summary_in_reasoning_effort)
    optional_params = m.get_optional_params(
        **{arg: named.get(arg) for arg in _OPTIONAL_PARAM_ARGS}, model=model, custom_llm_provider=provider,
        max_retries=unnamed.get("max_retries"), messages=messages, reasoning_effort=effort,
        thinking=reasoning.thinking, allowed_openai_params=allowed, base_model=None, model_info=None,
        **provider_params)
    return optional_params, reasoning.effort.value


def _wire_body(route: _DirectRoute, messages: list[Any], optional_params: Mapping[str, Any],
               headers: dict[str, str], stream: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """What LiteLLM's OpenAI handler and the openai SDK make of the prepared call: the config's
    `transform_request`, stream options, then `extra_body` merged into the body."""
    outbound = litellm_main.with_attribution_headers(route.config.get_attribution_headers(), headers) or {}
    params = {k: v for k, v in optional_params.items() if k not in ("stream", "stream_options", "max_retries")}
    if outbound:
        params["extra_headers"] = outbound
    data = route.config.transform_request(
        model=route.model, messages=messages, optional_params=params,
        litellm_params={"custom_llm_provider": route.provider, "api_base": route.api_base}, headers=outbound)
    if stream:
        data["stream"] = True
        if optional_params.get("stream_options") is not None:
            data["stream_options"] = optional_params["stream_options"]
    body = {k: v for k, v in data.items() if k not in _SDK_OPTIONS}
    body.update(data.get("extra_body") or {})
    return body, dict(data.get("extra_headers") or {})


_SDK_STATUS_ERRORS: dict[int, type[openai.APIStatusError]] = {
    400: openai.BadRequestError, 401: openai.AuthenticationError, 403: openai.PermissionDeniedError,
    404: openai.NotFoundError, 409: openai.ConflictError, 422: openai.UnprocessableEntityError,
    429: openai.RateLimitError,
}


def _sdk_status_error(response: httpx.Response) -> openai.APIStatusError:
    """The openai SDK's exception for an error status (`_make_status_error_from_response`)."""
    message = f"Error code: {response.status_code}"
    body: Any = response.text.strip()
    try:
        body = json.loads(body)
    except ValueError:
        pass
    else:
        error = body.get("error", body) if isinstance(body, Mapping) else None
        detail = error.get("message") if isinstance(error, Mapping) else None
        if isinstance(detail, str) and detail:
            message += f" - {detail}"
    data = body.get("error", body) if isinstance(body, Mapping) else body
    kind = _SDK_STATUS_ERRORS.get(response.status_code) or (
        openai.InternalServerError if response.status_code >= 500 else openai.APIStatusError)
    return kind(message, response=response, body=data)


def _with_context(error: BaseException, context: BaseException | None) -> BaseException:
    if error.__cause__ is None and error.__context__ is None:
        error.__context__ = context
    return error


def _litellm_exception(original: Exception, model: str) -> Exception:
    """The exception `litellm.exception_type` makes of a provider failure."""
    try:
        exception_type(model=model, original_exception=original, custom_llm_provider="openai")
    except Exception as mapped:  # it raises the mapped exception
        return mapped
    return original


def _openai_error(error: Exception) -> OpenAIError:
    """What LiteLLM's OpenAI handler wraps any failure of the SDK call in."""
    response = getattr(error, "response", None)
    headers = getattr(error, "headers", None)
    if headers is None and response is not None:
        headers = getattr(response, "headers", None)
    wrapped = OpenAIError(status_code=getattr(error, "status_code", 500), message=getattr(error, "message", str(error)),
                          response=upstream_error_response(error), headers=headers, body=getattr(error, "body", None))
    wrapped.__context__ = error
    return wrapped


class OpenAIDirectCodec:
    """LiteLLM's reading of a direct exchange: answers through its own response conversion, failures
    through the exceptions its OpenAI handler, the openai SDK and its stream wrapper would raise."""

    repetition_limit = litellm.REPEATED_STREAMING_CHUNK_LIMIT

    def completion(self, response: httpx.Response, call: DirectCall) -> dict[str, Any]:
        headers = dict(response.headers)
        try:
            parsed = self._sdk_parse(response)
            try:
                answer = self._converted(parsed, headers)
            except Exception:  # its message quotes the dict: word it on the SDK's key order, as LiteLLM does
                answer = self._converted(_sdk_ordered(parsed), headers)
        except Exception as exc:
            raise self._mapped(_openai_error(exc), call)
        return answer.model_dump()

    @staticmethod
    def _converted(parsed: dict[str, Any], headers: dict[str, str]) -> Any:
        return convert_to_model_response_object(
            response_object=OpenAIGPTConfig().transform_parsed_response_dict(parsed),
            model_response_object=_empty_model_response(), hidden_params={"headers": headers},
            _response_headers=headers)

    @staticmethod
    def _sdk_parse(response: httpx.Response) -> dict[str, Any]:
        """The body as LiteLLM gets it from the openai SDK: the JSON object (under another content type,
        the text when it is no JSON). The SDK's unvalidated model round trip changes only key order."""
        content_type = response.headers.get("content-type", "*").split(";")[0]
        try:
            data: Any = response.json()
        except ValueError:
            if content_type.endswith("json"):
                raise
            data = response.text
        if not isinstance(data, dict):
            raise OpenAIError(status_code=500, message=(
                f"Empty or invalid response from LLM endpoint. Received: {data!r}. "
                "Check the reverse proxy or model server configuration."))
        return data

    @staticmethod
    def _mapped(error: Exception, call: DirectCall) -> UpstreamError:
        mapped = _litellm_exception(error, str(call.request.litellm_params["model"]))
        upstream = _map_error(_with_context(mapped, error))
        upstream.__cause__ = mapped
        return upstream

    def status_error(self, response: httpx.Response, call: DirectCall) -> Exception:
        return self._mapped(_openai_error(_sdk_status_error(response)), call)

    def transport_error(self, error: Exception, call: DirectCall, elapsed: float, stream: bool) -> Exception:
        request = _request_of(error, call)
        if isinstance(error, httpx.TimeoutException):
            sdk_error: openai.APIConnectionError = openai.APITimeoutError(request=request)
            if not stream:
                sdk_error.message += f" - timeout value={call.timeout}, time taken={round(elapsed, 2)} seconds"
        else:
            sdk_error = openai.APIConnectionError(request=request)
        sdk_error.__cause__ = error
        wrapped = OpenAIError(status_code=500, message=str(sdk_error) if stream else sdk_error.message)
        wrapped.__context__ = sdk_error
        return self._mapped(wrapped, call)

    def stream_error(self, error: Exception, call: DirectCall, generated: str, started: bool) -> Exception:
        raw, handling = self._stream_failure(error, call)
        if isinstance(raw, OpenAIError):
            mapped: Exception = raw
        else:
            mapped = _litellm_exception(raw, call.model)
        statuses = (getattr(mapped, "status_code", None), getattr(raw, "status_code", None))
        timed_out = isinstance(raw, httpx.TimeoutException)
        if not timed_out and any(isinstance(s, int) and 400 <= s < 500 and s != 429 for s in statuses):
            final = mapped
        else:
            final = litellm.exceptions.MidStreamFallbackError(
                message=str(mapped), model=call.model, llm_provider="openai", original_exception=mapped,
                generated_content=generated, is_pre_first_chunk=not started)
        final.__context__ = handling
        upstream = _map_error(final)
        upstream.__cause__ = final
        return upstream

    @staticmethod
    def _stream_failure(error: Exception, call: DirectCall) -> tuple[Exception, BaseException]:
        """The exception LiteLLM's stream wrapper would handle, and the one it handles it within."""
        if isinstance(error, EndedWithoutFinish):
            eof = httpx.RemoteProtocolError(str(error), request=httpx.Request("POST", "https://docs.litellm.ai/docs"))
            return eof, StopAsyncIteration()
        if isinstance(error, ErrorEvent):
            event_error = openai.APIError(message=error.message, request=_request_of(error, call), body=error.body)
            return event_error, event_error
        if isinstance(error, Repetition):
            repeated = litellm.InternalServerError(
                message=f"The model is repeating the same chunk = {error.content}.", model="", llm_provider="")
            return repeated, repeated
        if isinstance(error, httpx.TimeoutException):
            sdk: Exception = openai.APITimeoutError(request=_request_of(error, call))
        elif isinstance(error, httpx.HTTPError):
            sdk = openai.APIConnectionError(request=_request_of(error, call))
        else:
            return error, error
        sdk.__cause__ = error
        return sdk, sdk

    def finish_reason(self, reason: str) -> str:
        return map_finish_reason(reason)

    def usage_estimate(self, call: DirectCall, generated: str, reasoning: str) -> dict[str, Any]:
        """Usage as LiteLLM's stream chunk builder counts it when the provider reported none."""
        messages = json.loads(call.body).get("messages") or []
        prompt = litellm.token_counter(model=call.model, messages=messages)
        completion = litellm.token_counter(model=call.model, text=generated, count_response_tokens=True) + (
            litellm.token_counter(text=reasoning, count_response_tokens=True) if reasoning else 0)
        return {"completion_tokens": completion, "prompt_tokens": prompt, "total_tokens": prompt + completion}


def _request_of(error: Exception, call: DirectCall) -> httpx.Request:
    """The request an httpx error belongs to (unset on some), else the call's."""
    try:
        request = getattr(error, "request", None)
    except RuntimeError:
        request = None
    return request if isinstance(request, httpx.Request) else httpx.Request("POST", call.url)


def _sdk_ordered(data: dict[str, Any]) -> dict[str, Any]:
    """The dict the openai SDK's unvalidated ChatCompletion dumps back: the same values, its key order."""
    model = openai._models.construct_type(type_=openai.types.chat.ChatCompletion, value=data)
    return model.model_dump(exclude_unset=True)


def _empty_model_response() -> Any:
    response = litellm.ModelResponse()
    response.usage = litellm.Usage()
    return response
