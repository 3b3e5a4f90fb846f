"""`POST {api_base}/responses/compact` on a deployment that speaks OpenAI's Responses API (issue 32).

LiteLLM has no call for OpenAI's compaction endpoint, so the gateway posts it itself, over httpx,
built only from the deployment's config: its `api_base` (default OpenAI's), its `api_key` (else
`OPENAI_API_KEY`, as LiteLLM would read it), its `extra_headers`, and the model as the provider knows
it (`openai/gpt-5` -> `gpt-5`). Nothing of the client's request chooses the host, the path, a header
or a credential: the body is `model`, `input` and `instructions`, which the caller builds.

A provider without the endpoint (404, 405 or 501: an OpenAI-compatible server that has `/responses`
only) raises `NoCompactEndpoint`, so the caller answers the compaction itself; every other failure is
the gateway's usual upstream error, the provider's message cleaned as gateway/upstream/errors.py does.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import httpx

from gateway.errors import UpstreamInvalidResponse, UpstreamTimeout, UpstreamUnavailable, upstream_error_for_status
from gateway.upstream.errors import client_message, log_upstream_error
from gateway.upstream.seam import UPSTREAM_REQUEST_ID_HEADER

OPENAI_API_BASE = "https://api.openai.com/v1"
_MISSING = (404, 405, 501)


class NoCompactEndpoint(Exception):
    """The deployment's server has no `/responses/compact`."""


def provider_model(litellm_params: Mapping[str, Any]) -> str:
    model = str(litellm_params["model"])
    return model.split("/", 1)[1] if model.startswith("openai/") else model


def _endpoint(litellm_params: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    base = litellm_params.get("api_base") or litellm_params.get("base_url") or OPENAI_API_BASE
    key = litellm_params.get("api_key") or os.environ.get("OPENAI_API_KEY") or ""
    headers = {str(k): str(v) for k, v in (litellm_params.get("extra_headers") or {}).items()}
    headers |= {"content-type": "application/json", "accept": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    if litellm_params.get("organization"):
        headers["openai-organization"] = str(litellm_params["organization"])
    return f"{str(base).rstrip('/')}/responses/compact", headers


async def post_compact(litellm_params: Mapping[str, Any], body: Mapping[str, Any], *, timeout: float,
                       request_id: str) -> dict[str, Any]:
    """The provider's compacted response (`{"object": "response.compaction", "output": [...], ...}`)."""
    url, headers = _endpoint(litellm_params)
    headers[UPSTREAM_REQUEST_ID_HEADER] = request_id
    hidden = [str(litellm_params.get("api_base") or ""), str(litellm_params.get("api_key") or "")]
    try:
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as client:
            response = await client.post(url, content=json.dumps({**body, "model": provider_model(litellm_params)}),
                                         headers=headers)
    except httpx.TimeoutException as exc:
        log_upstream_error(request_id, type(exc).__name__, str(exc), "upstream_timeout")
        raise UpstreamTimeout("upstream: the provider did not answer the compaction in time") from exc
    except httpx.HTTPError as exc:
        log_upstream_error(request_id, type(exc).__name__, str(exc), "upstream_unavailable")
        raise UpstreamUnavailable("upstream: the provider could not be reached") from exc
    if response.status_code in _MISSING:
        raise NoCompactEndpoint(response.status_code)
    if response.status_code >= 400:
        said = client_message(response.text, hidden)
        error = upstream_error_for_status(response.status_code, f"upstream: {said or 'the compaction failed'}")
        log_upstream_error(request_id, f"http {response.status_code}", response.text, error.code)
        raise error
    try:
        answer = response.json()
    except ValueError as exc:
        raise UpstreamInvalidResponse("upstream: the compaction's answer is not JSON") from exc
    if not isinstance(answer, dict) or not isinstance(answer.get("output"), list) \
            or not all(isinstance(item, dict) for item in answer["output"]):
        raise UpstreamInvalidResponse("upstream: the compaction's answer has no output items")
    return answer
