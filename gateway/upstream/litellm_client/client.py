"""`UpstreamClient` over LiteLLM (with the other gateway/litellm_*.py modules, the only ones that import
it): one `litellm` call per request, its arguments under one rule (gateway/upstream/litellm_client/params.py). Every
stream it opens is closed when its reader stops, whatever stops it (gateway/upstream/litellm_client/streams.py for
LiteLLM's, `closing` for the direct transport's).

LiteLLM is configured per call (no global callback lists, no module flags
beyond the offline environment set before import), so concurrent requests
for different tenants and models cannot affect each other.

Chat completions for a deployment that speaks OpenAI's wire format skip
`litellm.acompletion`'s per-call machinery (issue 11): `DirectChat`
(gateway/upstream/direct_chat.py) posts them over a pooled HTTP client, while LiteLLM
still decides everything about the exchange (gateway/upstream/litellm_client/direct.py):
eligibility (`direct_route`), the body and headers (`openai_request`, LiteLLM's
own transformation functions in `litellm.completion`'s order), the reading of
answers and the wording of failures (`OpenAIDirectCodec`). Both paths then get the same post-processing
(`_completion_out`, `_chunk_out`), which also removes LiteLLM's artefacts, so
clients get OpenAI's shape either way. GATEWAY_DIRECT_TRANSPORT=0 turns it off.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, AsyncIterator, Callable, Mapping

from gateway.errors import GatewayError, UpstreamError, UpstreamInvalidResponse, upstream_error_for_status
from gateway.pipeline import tool_additions
from gateway.threads import off_loop
from gateway.upstream.direct_chat import DirectCall, DirectChat
from gateway.upstream.errors import client_message
from gateway.upstream.litellm_client import gemini
from gateway.upstream.litellm_client.anthropic_fields import SseFrames, event_error, message_events, place_fields
from gateway.upstream.litellm_client.base import PRICING_KEYS, litellm, map_error
from gateway.upstream.litellm_client.chat_preparation import MessageMemo, json_body
from gateway.upstream.litellm_client.direct import (
    OpenAIDirectCodec,
    direct_route,
    direct_wanted,
    openai_http_client,
    openai_request,
)
from gateway.upstream.litellm_client.params import NAMED, chat_by_name, split_body
from gateway.upstream.litellm_client.prices import deployment_prices, usage_cost
from gateway.upstream.litellm_client.streams import LiteLLMStream
from gateway.upstream.seam import UPSTREAM_REQUEST_ID_HEADER, Api, Prices, UpstreamRequest, closing


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
    no NaN or infinity in it); the messages the memo prepared before from the texts it kept (`json_body`)."""
    return json_body(body)


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

    async def call(self, api: Api, request: UpstreamRequest) -> dict[str, Any]:
        if api in ("embeddings", "completions"):
            return await self._plain(api, request)
        if api == "generate_content":
            return await gemini.generate(request, gemini.call_kwargs(request, self._call_kwargs))
        calls = {"chat": self._chat, "messages": self._messages, "responses": self._responses}
        return await calls[api](request)

    def stream(self, api: Api, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        if api == "generate_content":
            return self._stream_generate(request)
        streams = {"chat": self._stream_chat, "messages": self._stream_messages, "responses": self._stream_responses,
                   "completions": self._stream_text_completion}  # embeddings do not stream
        return streams[api](request)

    def _direct_call(self, request: UpstreamRequest, stream: bool) -> DirectCall | None:
        """The direct exchange LiteLLM would make for a chat request, or None to let LiteLLM make it."""
        if self._direct is None:
            return None
        route = direct_route(request.litellm_params)
        if route is None:
            return None
        kwargs = self._kwargs(request, stream)  # a body field no call takes is refused here, as on LiteLLM's path
        try:
            built = openai_request(route, kwargs, stream, self._memo, _known_digests(request))
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
    def _call_kwargs(request: UpstreamRequest, by_name: Callable[[str], bool], *,
                     stream: bool | None = None) -> dict[str, Any]:
        """A LiteLLM call's arguments: the deployment's litellm_params, the body's fields LiteLLM takes by
        name (`by_name`), and the other body fields in `extra_body`, sent to the provider as the client sent
        them. A body field never becomes a call option (gateway/upstream/litellm_client/params.py)."""
        params = {k: v for k, v in request.litellm_params.items() if k not in PRICING_KEYS}
        named, in_body = split_body(request.body, by_name)
        kwargs: dict[str, Any] = {"max_retries": 0, **params, **named}
        extra_body = {**(kwargs.pop("extra_body", None) or {}), **in_body}
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
        by_name = chat_by_name(str(params["model"]), params.get("custom_llm_provider"))
        kwargs = self._call_kwargs(request, by_name, stream=True if stream else None)
        if stream:
            # Usage is always asked for, so the run is recorded; the caller
            # passes the usage chunk on only if the client asked for it.
            kwargs["stream_options"] = {**(kwargs.get("stream_options") or {}), "include_usage": True}
        return kwargs

    def _tool_changes_for(self, request: UpstreamRequest) -> UpstreamRequest:
        """The request as this deployment takes it: tools added mid-conversation
        (gateway/pipeline/tool_additions.py) go to native Anthropic deployments that have not refused them,
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
        kwargs = self._call_kwargs(request, NAMED["messages"].__contains__, stream=stream)
        return place_fields(kwargs, request.body)

    async def _create_message(self, request: UpstreamRequest, stream: bool) -> Any:
        """`litellm.anthropic.messages.acreate` for the request as this deployment takes it, sent again
        with the tools declared in `tools` if the deployment refuses tools added mid-conversation."""
        request = self._tool_changes_for(request)
        kwargs = self._messages_kwargs(request, stream=stream)
        try:
            return await litellm.anthropic.messages.acreate(**kwargs)
        except Exception as exc:
            request = self._refused_tool_changes(request, map_error(exc, request), exc)
        return await litellm.anthropic.messages.acreate(**self._messages_kwargs(request, stream=stream))

    async def _messages(self, request: UpstreamRequest) -> dict[str, Any]:
        try:
            response = await self._create_message(request, stream=False)
        except GatewayError:  # ours (a refused field, an invalid answer): as it is
            raise
        except Exception as exc:
            raise map_error(exc, request) from exc
        body = response if isinstance(response, dict) else response.model_dump()
        if not isinstance(body.get("content"), list):
            raise UpstreamInvalidResponse("upstream: the answer is not a message (no content blocks)")
        return body

    async def _stream_messages(self, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        try:
            stream = await self._create_message(request, stream=True)
            if not hasattr(stream, "__aiter__"):  # a whole message (LiteLLM's mock answers so): its events
                for event in message_events(stream if isinstance(stream, dict) else stream.model_dump()):
                    yield event
                return
            frames = SseFrames()
            async with LiteLLMStream(stream) as chunks:
                async for chunk in chunks:
                    for event in frames.feed(chunk):
                        if event.get("type") == "error":
                            raise event_error(event)
                        yield event
        except GatewayError:  # ours (a refused field, an invalid answer): as it is
            raise
        except Exception as exc:
            raise map_error(exc, request) from exc

    def _responses_kwargs(self, request: UpstreamRequest, stream: bool) -> dict[str, Any]:
        return self._call_kwargs(request, NAMED["responses"].__contains__, stream=stream)

    async def _responses(self, request: UpstreamRequest) -> dict[str, Any]:
        kwargs = self._responses_kwargs(request, stream=False)
        try:
            response = await litellm.aresponses(**kwargs)
        except Exception as exc:
            raise map_error(exc, request) from exc
        body = response if isinstance(response, dict) else response.model_dump(warnings=False)
        if not isinstance(body.get("output"), list):
            raise UpstreamInvalidResponse("upstream: the answer is not a response (no output items)")
        return _drop_none(body, _KEEP_NULL)

    async def _stream_responses(self, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        try:
            stream = await litellm.aresponses(**self._responses_kwargs(request, stream=True))
            async with LiteLLMStream(stream) as events:
                async for event in events:
                    data = event if isinstance(event, dict) else event.model_dump(warnings=False)
                    if data.get("type") == "error":
                        said = client_message(str(data.get("message") or ""))
                        raise upstream_error_for_status(
                            502, f"upstream: {said or 'the provider sent an error event'}")
                    yield _drop_none(data, _KEEP_NULL)
        except GatewayError:  # ours (a refused field, an invalid answer): as it is
            raise
        except Exception as exc:
            raise map_error(exc, request) from exc

    async def _stream_generate(self, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        kwargs = gemini.call_kwargs(request, self._call_kwargs)  # a refused field: InvalidRequest, before any byte
        async for event in gemini.stream_generate(request, kwargs):
            yield event

    async def _plain(self, api: str, request: UpstreamRequest) -> dict[str, Any]:
        """An embeddings or text completion answer; OpenAI's documented fields by name, the others in
        `extra_body`."""
        send = litellm.aembedding if api == "embeddings" else litellm.atext_completion
        kwargs = self._call_kwargs(request, NAMED[api].__contains__)  # a refused field: InvalidRequest, as it is
        try:
            response = await send(**kwargs)
        except Exception as exc:
            raise map_error(exc, request) from exc
        return _drop_none(response.model_dump(), _KEEP_NULL)

    async def _stream_text_completion(self, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        kwargs = self._call_kwargs(request, NAMED["completions"].__contains__)
        # Usage is always asked for (LiteLLM drops the provider's usage otherwise), so the run is
        # recorded with its tokens and cost; the caller passes the usage chunk on only if the client asked.
        kwargs["stream_options"] = {**(kwargs.get("stream_options") or {}), "include_usage": True}
        try:
            async with LiteLLMStream(await litellm.atext_completion(**kwargs, stream=True)) as chunks:
                async for chunk in chunks:
                    yield _drop_none(chunk if isinstance(chunk, dict) else chunk.model_dump(), _KEEP_NULL)
        except GatewayError:  # ours (a refused field, an invalid answer): as it is
            raise
        except Exception as exc:
            raise map_error(exc, request) from exc

    async def warm_up(self) -> None:
        """Load what LiteLLM loads on its first call and first stream (offline: a mock answer).

        Without LiteLLM's token counter: pricing a mock stream, which reports no usage, would count its
        tokens, and that loads LiteLLM's default encoding (cl100k_base), 14 MB of resident memory kept for
        good, which no call of the direct transport needs (it reads the provider's usage). A real call
        that needs a count loads it then. Safe to switch off here: the app serves nothing before its
        start-up is done."""
        messages = [{"role": "user", "content": "warm up"}]
        counting, litellm.disable_token_counter = litellm.disable_token_counter, True
        try:
            await litellm.acompletion(model="openai/warm-up", messages=messages, mock_response="ok", api_key="-")
            stream = await litellm.acompletion(model="openai/warm-up", messages=messages, mock_response="ok",
                                               api_key="-", stream=True)
            async with LiteLLMStream(stream) as chunks:
                async for _ in chunks:
                    pass
        finally:
            litellm.disable_token_counter = counting

    async def _direct_call_built(self, request: UpstreamRequest, stream: bool) -> DirectCall | None:
        """`_direct_call`, on a worker thread for a long transcript: LiteLLM's preparation walks every
        message it has not seen (gateway/upstream/litellm_client/chat_preparation.py) and keys the others, which for a long one
        on the event loop would stall every other request (bench/direct_prep.py times it)."""
        if len(request.body.get("messages") or ()) < _OFF_LOOP_MESSAGES:
            return self._direct_call(request, stream)
        return await off_loop(self._direct_call, request, stream)

    async def _chat(self, request: UpstreamRequest) -> dict[str, Any]:
        call = await self._direct_call_built(request, stream=False)
        if call is not None and self._direct is not None:
            return check_completion(_completion_out(await self._direct.complete(call)))
        kwargs = self._kwargs(request, stream=False)
        try:
            response = await litellm.acompletion(**kwargs)
        except Exception as exc:  # LiteLLM raises many types; map them once, here
            raise map_error(exc, request) from exc
        return check_completion(_completion_out(response.model_dump()))

    async def _stream_chat(self, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        call = await self._direct_call_built(request, stream=True)
        if call is not None and self._direct is not None:
            async with closing(self._direct.stream(call)) as direct:
                async for chunk in direct:
                    yield _chunk_out(chunk)
            return
        try:
            received = 0
            async with LiteLLMStream(await litellm.acompletion(**self._kwargs(request, stream=True))) as chunks:
                async for chunk in chunks:
                    received += 1
                    out = _chunk_out(chunk.model_dump())
                    if _finishes(out) and not _provider_finished(chunks.stream):
                        # LiteLLM makes up a closing chunk when the body held no events at all
                        # (a JSON or HTML answer to a streaming request): that is no completion.
                        raise UpstreamInvalidResponse(
                            f"upstream: the stream held no completion events ({_content_type(chunks.stream)})")
                    yield out
            if not received:
                raise UpstreamInvalidResponse("upstream: the stream ended before any completion event")
        except GatewayError:  # ours (a refused field, an invalid answer): as it is
            raise
        except Exception as exc:
            raise map_error(exc, request) from exc

    def prices(self, litellm_params: Mapping[str, Any]) -> Prices | None:
        return deployment_prices(litellm_params)

    def cost_usd(self, litellm_params: Mapping[str, Any], usage: Mapping[str, Any]) -> float | None:
        return usage_cost(litellm_params, usage)


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
