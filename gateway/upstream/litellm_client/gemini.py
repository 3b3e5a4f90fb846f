"""Google's generateContent through LiteLLM (`litellm.google_genai`), answers in Google's shape.

A Gemini deployment (provider `gemini`, or `vertex_ai` with a Gemini model) gets the
request in its own format: `contents`, `tools` and `systemInstruction` by name, every
other field of the body (generationConfig, toolConfig, safetySettings, cachedContent,
...) in `extra_body`, which LiteLLM puts in the request as it is, so nothing the
client sent is filtered. Any other provider gets it through LiteLLM's adapter
(generateContent to chat completions and back), which reads `generationConfig`,
`tools`, `toolConfig` and `systemInstruction`; a field only Google serves is refused
by name. Answers come back as Google's JSON, streams as its chunks (LiteLLM yields
them as server-sent event bytes).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, AsyncIterator, Callable, Mapping

from gateway.errors import GatewayError, InvalidRequest, UpstreamInvalidResponse, upstream_error_for_status
from gateway.upstream.errors import client_message
from gateway.upstream.litellm_client.anthropic_fields import SseFrames
from gateway.upstream.litellm_client.base import litellm, map_error
from gateway.upstream.litellm_client.streams import LiteLLMStream
from gateway.upstream.seam import UpstreamRequest

_NAMED = frozenset({"contents", "tools", "systemInstruction"})  # the rest of GENERATE_CONTENT: in the body
_ADAPTED = frozenset({"contents", "tools", "systemInstruction", "toolConfig", "generationConfig"})
_DROPPED_ELSEWHERE = frozenset({"safetySettings", "labels"})  # no meaning to another provider

KwargsFor = Callable[[UpstreamRequest, Callable[[str], bool]], dict[str, Any]]


def native(params: Mapping[str, Any]) -> bool:
    """Whether a deployment speaks Gemini's own API (LiteLLM then sends the request as it is)."""
    model = str(params["model"])
    provider = params.get("custom_llm_provider") or model.split("/", 1)[0]
    return provider == "gemini" or (provider == "vertex_ai" and "gemini" in model)


def call_kwargs(request: UpstreamRequest, kwargs_for: KwargsFor) -> dict[str, Any]:
    """`litellm.google_genai`'s arguments for the request (`kwargs_for`: the client's common rule)."""
    if native(request.litellm_params):
        kwargs = kwargs_for(request, _NAMED.__contains__)
    else:
        own = sorted(k for k in request.body if k not in _ADAPTED and k not in _DROPPED_ELSEWHERE)
        if own:
            raise InvalidRequest(f"{own[0]}: a field of Google's API, which the model '{request.alias}' is not "
                                 "served by", param=own[0], code="unsupported_parameter")
        body = {k: v for k, v in request.body.items() if k in _ADAPTED}
        kwargs = kwargs_for(replace(request, body=body), _ADAPTED.__contains__)
        if "generationConfig" in kwargs:
            kwargs["config"] = kwargs.pop("generationConfig")
    kwargs.pop("max_retries", None)
    return kwargs


def _answer(response: Any) -> dict[str, Any]:
    if isinstance(response, dict):
        body = response
    else:
        body = response.model_dump(exclude_none=True, warnings=False)
    if not isinstance(body.get("candidates"), list):
        raise UpstreamInvalidResponse("upstream: the answer is not a GenerateContentResponse (no candidates)")
    return body


async def generate(request: UpstreamRequest, kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        response = await litellm.google_genai.agenerate_content(**kwargs)
    except GatewayError:
        raise
    except Exception as exc:
        raise map_error(exc, request) from exc
    return _answer(response)


def _chunk_error(chunk: dict[str, Any]) -> GatewayError:
    error = chunk.get("error") if isinstance(chunk.get("error"), dict) else {}
    code = error.get("code")
    status = code if isinstance(code, int) and 400 <= code < 600 else 502
    said = client_message(str(error.get("message") or ""))
    return upstream_error_for_status(status, f"upstream: {said or 'the provider sent an error'}")


async def stream_generate(request: UpstreamRequest, kwargs: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    try:
        stream = await litellm.google_genai.agenerate_content_stream(**kwargs)
        frames = SseFrames()
        async with LiteLLMStream(stream) as chunks:
            async for chunk in chunks:
                for event in frames.feed(chunk):
                    if "error" in event:
                        raise _chunk_error(event)
                    yield event
    except GatewayError:
        raise
    except Exception as exc:
        raise map_error(exc, request) from exc
