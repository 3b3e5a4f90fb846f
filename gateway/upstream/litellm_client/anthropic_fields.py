"""An Anthropic Messages request's fields beyond those LiteLLM names, sent on to the provider (issue 27).

`litellm.anthropic.messages.acreate` sends a deployment that speaks Messages natively (Anthropic,
and Claude on Vertex AI, Azure AI, Bedrock...) only the fields its own list of Anthropic parameters
holds, and takes no `extra_body` there; other deployments go through its adapter to
`litellm.completion`, which passes `extra_body` into the provider's request body. So a field the
gateway does not name (gateway/upstream/litellm_client/params.py) goes:

- to an adapted deployment in `extra_body`, as chat completions send it;
- to a native one inside the JSON body LiteLLM built, by the HTTP client of this one call
  (`BodyFields`: LiteLLM's own pooled client, whose `post` adds the fields the body lacks);
- nowhere, with a 400 naming it, for a native deployment whose requests are signed over their body
  (Bedrock): a field added after signing would void the signature.

Claude Code sends Anthropic's newest fields (context management, betas' fields) as soon as it uses
them; passed on, they work as they do against Anthropic directly. The client's `anthropic-beta`
header reaches a native deployment as it was sent: LiteLLM merges the betas it adds into a sorted
list, and `BodyFields` puts the client's back in their order (the added ones after them).

`context_management` (LiteLLM names it) goes to a native deployment as sent. An adapted one gets it
through LiteLLM's adapter, which applies `clear_tool_uses_20250919` itself (on what the gateway
forwards, reporting `applied_edits` as Anthropic does) and has nothing to clear for
`clear_thinking_20251015` (Claude Code sends it whenever thinking is on, so it must not fail the
request); any other edit (`compact_20260112`: the adapter would make a summary call of its own,
which the gateway neither routes nor records) is refused with a 400 naming it.

Reading what LiteLLM's Messages calls give back is here too: SSE frames (`SseFrames`), the events of
a message answered whole (`message_events`), an error event's UpstreamError (`event_error`).
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from litellm.llms.anthropic.messages.native.handler import _native_messages_config
from litellm.llms.base_llm.anthropic_messages.transformation import BaseAnthropicMessagesConfig
from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler, get_async_httpx_client

from gateway.errors import InvalidRequest, UpstreamError, UpstreamInvalidResponse, upstream_error_for_status
from gateway.upstream.errors import client_message
from gateway.upstream.litellm_client.base import litellm
from policies.memo import memo


BETA_HEADER = "anthropic-beta"
# The edits LiteLLM's adapter takes for a deployment that does not speak Messages (see above).
ADAPTED_EDITS = frozenset({"clear_tool_uses_20250919", "clear_thinking_20251015"})


class BodyFields(AsyncHTTPHandler):
    """LiteLLM's pooled HTTP client for Anthropic-native calls, posting JSON bodies with `fields` added
    (the body's own keys win) and the client's `betas` in the order it sent them. Made per call: it
    shares the pool, and holds no state beyond its fields and betas."""

    def __init__(self, inner: AsyncHTTPHandler, fields: Mapping[str, Any], betas: str | None = None) -> None:
        self.__dict__.update(inner.__dict__)  # no pool of its own
        self.fields = dict(fields)
        self.betas = betas

    async def post(self, url: str, data: Any = None, *args: Any, **kwargs: Any) -> Any:
        if self.fields and isinstance(data, (str, bytes)):
            body = json.loads(data)
            if isinstance(body, dict):
                data = json.dumps({**body, **{k: v for k, v in self.fields.items() if k not in body}})
        headers = kwargs.get("headers")
        if self.betas and isinstance(headers, dict) and isinstance(headers.get(BETA_HEADER), str):
            kwargs["headers"] = {**headers, BETA_HEADER: betas_as_sent(self.betas, headers[BETA_HEADER])}
        return await super().post(url, data, *args, **kwargs)


def betas_as_sent(sent: str, merged: str) -> str:
    """The `anthropic-beta` value LiteLLM made (`merged`) with the client's betas (`sent`) as it wrote
    them: its exact text when LiteLLM added none, else its betas in its order, then the added ones."""
    ours = [b.strip() for b in sent.split(",") if b.strip()]
    theirs = [b.strip() for b in merged.split(",") if b.strip()]
    if set(ours) == set(theirs):
        return sent
    kept = [b for b in dict.fromkeys(ours) if b in theirs]
    return ",".join(kept + [b for b in theirs if b not in kept])


def _check_adapted_edits(value: Any) -> None:
    """A 400 naming an edit of `context_management` LiteLLM's adapter would not apply by itself."""
    edits = value.get("edits") if isinstance(value, dict) else None
    for index, edit in enumerate(edits if isinstance(edits, list) else ()):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind not in ADAPTED_EDITS:
            param = f"context_management.edits[{index}]"
            raise InvalidRequest(f"{param}: the edit {kind} is applied by Anthropic's API, which this model is not "
                                 "served by", param=param, code="unsupported_parameter")


@memo(maxsize=256)
def _native(model: str, custom_provider: str | None, api_base: str | None) -> tuple[bool, bool]:
    """Whether LiteLLM serves the deployment on its native Messages route, and whether that route signs
    the body."""
    try:
        name, provider, _key, _base = litellm.get_llm_provider(model, custom_llm_provider=custom_provider,
                                                               api_base=api_base)
        config = _native_messages_config(name, provider, None, api_base)
    except Exception:  # a deployment LiteLLM cannot resolve: its own call reports it
        return False, False
    if config is None:
        return False, False
    return True, type(config).sign_request is not BaseAnthropicMessagesConfig.sign_request


def place_fields(kwargs: dict[str, Any], client_fields: Mapping[str, Any]) -> dict[str, Any]:
    """`acreate`'s arguments with their `extra_body` (the deployment's and `client_fields`) placed where
    LiteLLM's route for the deployment sends it, and the client's betas kept in its order; a 400 for an
    edit of `context_management` that an adapted deployment would not apply."""
    extra = kwargs.pop("extra_body", None)
    native, signs = _native(str(kwargs["model"]), kwargs.get("custom_llm_provider"), kwargs.get("api_base"))
    if not native:
        _check_adapted_edits(kwargs.get("context_management"))
        return {**kwargs, "extra_body": extra} if extra else kwargs
    if signs:
        refused = next((key for key in extra or () if key in client_fields), None)
        if refused is not None:
            raise InvalidRequest(f"Unrecognized request argument supplied: {refused} (this model's provider signs "
                                 "its requests, and takes only the fields the gateway names)", param=refused,
                                 code="unknown_parameter")
        return kwargs
    betas = (kwargs.get("extra_headers") or {}).get(BETA_HEADER)
    if not extra and not betas:
        return kwargs
    inner = get_async_httpx_client(llm_provider=litellm.LlmProviders.ANTHROPIC)
    return {**kwargs, "client": BodyFields(inner, extra or {}, betas)}


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


def event_error(event: dict[str, Any]) -> UpstreamError:
    error = event.get("error") or {}
    kind, message = error.get("type"), f"upstream: {client_message(str(error.get('message') or '')) or 'error event'}"
    status = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
              "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429,
              "overloaded_error": 529}.get(str(kind), 502)
    return upstream_error_for_status(status, message)
