"""`UpstreamClient` over LiteLLM (with gateway/litellm_base.py, gateway/litellm_direct.py and
gateway/litellm_messages.py, the only modules that import it): one `litellm` call per request.

LiteLLM is configured per call (no global callback lists, no module flags
beyond the offline environment set before import), so concurrent requests
for different tenants and models cannot affect each other.

Chat completions for a deployment that speaks OpenAI's wire format skip
`litellm.acompletion`'s per-call machinery (issue 11): `DirectChat`
(gateway/direct_chat.py) posts them over a pooled HTTP client, while LiteLLM
still decides everything about the exchange (gateway/litellm_direct.py):
eligibility (`direct_route`), the body and headers (`openai_request`, LiteLLM's
own transformation functions in `litellm.completion`'s order), the reading of
answers and the wording of failures (`OpenAIDirectCodec`). Both paths then get the same post-processing
(`_completion_out`, `_chunk_out`), which also removes LiteLLM's artefacts, so
clients get OpenAI's shape either way. GATEWAY_DIRECT_TRANSPORT=0 turns it off.
"""
from __future__ import annotations

import functools
import json
from dataclasses import replace
from typing import Any, AsyncIterator, Callable, Mapping

from gateway import tool_additions
from gateway.direct_chat import DirectCall, DirectChat
from gateway.errors import UpstreamError, UpstreamInvalidResponse, upstream_error_for_status
from gateway.litellm_base import PRICING_KEYS, litellm, map_error
from gateway.litellm_direct import OpenAIDirectCodec, direct_route, direct_wanted, openai_http_client, openai_request
from gateway.litellm_messages import MessageMemo
from gateway.threads import off_loop
from gateway.upstream import UPSTREAM_REQUEST_ID_HEADER, Prices, UpstreamRequest
from storage.canonical import compact_json_bytes

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
def _deployment_key(params: Mapping[str, Any]) -> str:
    return f"{params.get('api_base') or ''}|{params['model']}"


def _declared(request: UpstreamRequest) -> UpstreamRequest:
    return replace(request, body=tool_additions.as_declared_tools(request.body),
                   extra_headers=tool_additions.without_betas(request.extra_headers))


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


_OFF_LOOP_MESSAGES = 64  # transcripts this long are prepared for the direct transport on a worker thread


def _json_bytes(body: Mapping[str, Any]) -> bytes:
    """A body serialised as the openai SDK serialises it (parsed from the client's JSON and projected:
    no NaN or infinity in it)."""
    return compact_json_bytes(body)


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


def _known_digests(request: UpstreamRequest) -> list[bytes | None] | None:
    """The parse's digests of the body's messages forwarded as the client sent them (`client_digests`;
    a hidden round's messages after them have none); None after a first attempt (LiteLLM's own path
    may have fixed messages in place)."""
    messages, digests = request.body.get("messages"), request.client_digests
    if digests is None or request.attempts or type(messages) is not list:
        return None
    known = list(digests[:len(messages)])
    return known + [None] * (len(messages) - len(known))


class LiteLLMUpstream:
    """Calls providers through `litellm.acompletion`, one call per request; chat completions for an
    OpenAI-compatible deployment go over `DirectChat` instead, with LiteLLM deciding what is sent.

    `direct_transport=None` reads GATEWAY_DIRECT_TRANSPORT (on unless "0", "false", "no" or "off").
    """

    def __init__(self, direct_transport: bool | None = None) -> None:
        wanted = direct_wanted() if direct_transport is None else direct_transport
        self._direct = DirectChat(OpenAIDirectCodec(), openai_http_client) if wanted else None
        self._memo = MessageMemo()  # LiteLLM's preparation of messages and params seen before (direct transport)
        self._without_tool_changes: set[str] = set()  # deployments that refused mid-conversation tool changes

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
            built = openai_request(route, self._kwargs(request, stream), stream, self._memo, _known_digests(request))
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
        params = {k: v for k, v in request.litellm_params.items() if k not in PRICING_KEYS}
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
        kwargs["extra_headers"] = {**(kwargs.get("extra_headers") or {}), **request.extra_headers,
                                   UPSTREAM_REQUEST_ID_HEADER: request.request_id}
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

    def _tool_changes_for(self, request: UpstreamRequest) -> UpstreamRequest:
        """The request as this deployment takes it: tools added mid-conversation
        (gateway/tool_additions.py) go to native Anthropic deployments that have not refused them,
        with the feature's betas; any other gets them in `tools`."""
        if not tool_additions.has_additions(request.body):
            return request
        params = request.litellm_params
        provider = params.get("custom_llm_provider") or str(params["model"]).split("/", 1)[0]
        if provider == "anthropic" and _deployment_key(params) not in self._without_tool_changes:
            return replace(request, extra_headers=tool_additions.with_betas(request.extra_headers))
        return _declared(request)

    def _refused_tool_changes(self, request: UpstreamRequest, error: UpstreamError,
                              exc: Exception) -> UpstreamRequest:
        """After a 400 to a request that adds tools mid-conversation: the same request with them in
        `tools`, and the deployment remembered as one without the feature. Any other failure is raised."""
        if error.status_code != 400 or not tool_additions.has_additions(request.body):
            raise error from exc
        self._without_tool_changes.add(_deployment_key(request.litellm_params))
        return _declared(request)

    def _messages_kwargs(self, request: UpstreamRequest, stream: bool) -> dict[str, Any]:
        return self._call_kwargs(request, _MESSAGES_PARAMS.__contains__, stream=stream, unnamed="drop")

    async def _create_message(self, request: UpstreamRequest, stream: bool) -> Any:
        """`litellm.anthropic.messages.acreate` for the request as this deployment takes it, sent again
        with the tools declared in `tools` if the deployment refuses tools added mid-conversation."""
        request = self._tool_changes_for(request)
        try:
            return await litellm.anthropic.messages.acreate(**self._messages_kwargs(request, stream=stream))
        except Exception as exc:
            request = self._refused_tool_changes(request, map_error(exc, request), exc)
        return await litellm.anthropic.messages.acreate(**self._messages_kwargs(request, stream=stream))

    async def messages(self, request: UpstreamRequest) -> dict[str, Any]:
        try:
            response = await self._create_message(request, stream=False)
        except UpstreamError:
            raise
        except Exception as exc:
            raise map_error(exc, request) from exc
        body = response if isinstance(response, dict) else response.model_dump()
        if not isinstance(body.get("content"), list):
            raise UpstreamInvalidResponse("upstream: the answer is not a message (no content blocks)")
        return body

    async def stream_messages(self, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        try:
            stream = await self._create_message(request, stream=True)
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
            raise map_error(exc, request) from exc

    def _responses_kwargs(self, request: UpstreamRequest, stream: bool) -> dict[str, Any]:
        return self._call_kwargs(request, _RESPONSES_PARAMS.__contains__, stream=stream)

    async def responses(self, request: UpstreamRequest) -> dict[str, Any]:
        try:
            response = await litellm.aresponses(**self._responses_kwargs(request, stream=False))
        except Exception as exc:
            raise map_error(exc, request) from exc
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
            raise map_error(exc, request) from exc

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
            raise map_error(exc, request) from exc
        return _drop_none(response.model_dump(), _KEEP_NULL)

    async def text_completion(self, request: UpstreamRequest) -> dict[str, Any]:
        try:
            response = await litellm.atext_completion(**self._plain_kwargs(request))
        except Exception as exc:
            raise map_error(exc, request) from exc
        return _drop_none(response.model_dump(), _KEEP_NULL)

    async def stream_text_completion(self, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        kwargs = self._plain_kwargs(request)
        # Usage is always asked for (LiteLLM drops the provider's usage otherwise), so the run is
        # recorded with its tokens and cost; the caller passes the usage chunk on only if the client asked.
        kwargs["stream_options"] = {**(kwargs.get("stream_options") or {}), "include_usage": True}
        try:
            chunks = await litellm.atext_completion(**kwargs, stream=True)
            async for chunk in chunks:
                yield _drop_none(chunk if isinstance(chunk, dict) else chunk.model_dump(), _KEEP_NULL)
        except UpstreamError:
            raise
        except Exception as exc:
            raise map_error(exc, request) from exc

    async def warm_up(self) -> None:
        """Load what LiteLLM loads on its first call and first stream (offline: a mock answer)."""
        messages = [{"role": "user", "content": "warm up"}]
        await litellm.acompletion(model="openai/warm-up", messages=messages, mock_response="ok", api_key="-")
        stream = await litellm.acompletion(model="openai/warm-up", messages=messages, mock_response="ok",
                                           api_key="-", stream=True)
        async for _ in stream:
            pass

    async def _direct_call_built(self, request: UpstreamRequest, stream: bool) -> DirectCall | None:
        """`_direct_call`, on a worker thread for a long transcript: LiteLLM's preparation walks every
        message it has not seen (gateway/litellm_messages.py) and keys the others, which for a long one
        on the event loop would stall every other request (bench/direct_prep.py times it)."""
        if len(request.body.get("messages") or ()) < _OFF_LOOP_MESSAGES:
            return self._direct_call(request, stream)
        return await off_loop(self._direct_call, request, stream)

    async def complete(self, request: UpstreamRequest) -> dict[str, Any]:
        call = await self._direct_call_built(request, stream=False)
        if call is not None and self._direct is not None:
            return check_completion(_completion_out(await self._direct.complete(call)))
        try:
            response = await litellm.acompletion(**self._kwargs(request, stream=False))
        except Exception as exc:  # LiteLLM raises many types; map them once, here
            raise map_error(exc, request) from exc
        return check_completion(_completion_out(response.model_dump()))

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        call = await self._direct_call_built(request, stream=True)
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
            raise map_error(exc, request) from exc

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


def _model_info(model: str) -> dict[str, Any] | None:
    try:
        return dict(litellm.get_model_info(model))
    except Exception:  # a model LiteLLM has no price for
        return None


@functools.lru_cache(maxsize=256)
def _map_prices(model: str) -> Prices | None:
    info = _model_info(model)
    if info is None and model.startswith("openai/"):
        # OpenAI's completions-only models (gpt-3.5-turbo-instruct, davinci-002) are priced in LiteLLM's
        # map under the provider its text_completion reaches them through.
        info = _model_info("text-completion-openai/" + model.removeprefix("openai/"))
    if info is None:
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
