"""LiteLLM, imported once with the offline environment set, and what both transports share.

The price map is read from LiteLLM's own copy and tiktoken's encodings from the
folder LiteLLM ships (no download, offline); Anthropic-format requests to
OpenAI-wire deployments go over chat completions. `map_error` turns LiteLLM's
and the openai SDK's exceptions into the gateway's UpstreamError family, for
calls through `litellm.acompletion` and for the direct transport alike.
"""
from __future__ import annotations

import os

from gateway.encodings import use_bundled_encodings

# Before LiteLLM is imported: no price-map download, tokenizers from its own folder.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
use_bundled_encodings()

import litellm  # noqa: E402

# Anthropic-format requests to OpenAI-wire deployments go over chat completions, which every
# OpenAI-compatible server has (LiteLLM would otherwise pick the Responses API for them).
litellm.use_chat_completions_url_for_anthropic_messages = True

from gateway.deployment_params import PRICING_KEYS  # noqa: E402,F401 (re-exported)
from gateway.errors import (  # noqa: E402
    UpstreamError,
    UpstreamInvalidResponse,
    UpstreamTimeout,
    UpstreamUnavailable,
    upstream_error_for_status,
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


def map_error(exc: Exception) -> UpstreamError:
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
