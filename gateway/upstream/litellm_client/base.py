"""LiteLLM, imported once with the offline environment set, and what both transports share.

The price map is read from LiteLLM's own copy and tiktoken's encodings from the
folder LiteLLM ships (no download: LiteLLM's offline mode); Anthropic-format requests to
OpenAI-wire deployments go over chat completions. `map_error` turns LiteLLM's
and the openai SDK's exceptions into the gateway's UpstreamError family, for
calls through `litellm.acompletion` and for the direct transport alike: the one
boundary where upstream failures are worded for clients.
"""
from __future__ import annotations

from typing import Any

# The package's __init__ has set the offline environment before this import: no price-map download,
# tokenizers from its own folder, and nothing else fetched on LiteLLM's own account (Anthropic's
# beta-header table, Hugging Face tokenizers): the only hosts a request reaches are its deployment's.
import litellm  # noqa: E402

from gateway.ops.logs import LITELLM_LOGGERS, hand_over  # noqa: E402

# Nothing printed on LiteLLM's own account: no "Give Feedback / Get Help" banner with each mapped
# exception or unknown provider, no verbose prints; its loggers' records go to the gateway's handler
# (JSON, with the request id) at the gateway's log level instead of its coloured one.
litellm.suppress_debug_info = True
litellm.set_verbose = False
hand_over(LITELLM_LOGGERS)

# Anthropic-format requests to OpenAI-wire deployments go over chat completions, which every
# OpenAI-compatible server has (LiteLLM would otherwise pick the Responses API for them).
litellm.use_chat_completions_url_for_anthropic_messages = True

from gateway.errors import (  # noqa: E402
    UpstreamError,
    UpstreamInvalidResponse,
    UpstreamTimeout,
    UpstreamUnavailable,
    upstream_error_for_status,
)
from gateway.upstream.deployment_params import PRICING_KEYS  # noqa: E402,F401 (re-exported)
from gateway.upstream.errors import client_message, log_upstream_error  # noqa: E402

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


def map_error(exc: Exception, request: Any = None) -> UpstreamError:
    """The UpstreamError for a failure LiteLLM (or the direct transport) raised: the provider's status,
    and a short message a client may read (gateway/upstream/errors.py); the whole text goes to the log
    with `request`'s id (an UpstreamRequest, or None) and the error's code."""
    error = _mapped(exc, request)
    original = f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
    log_upstream_error(getattr(request, "request_id", None), type(exc).__name__, original, error.code)
    return error


def _mapped(exc: Exception, request: Any) -> UpstreamError:
    api_base = str((getattr(request, "litellm_params", None) or {}).get("api_base") or "")
    said = client_message(str(getattr(exc, "message", None) or exc), hidden=(api_base, api_base.rstrip("/")))
    causes = _root_causes(exc)
    if isinstance(exc, litellm.Timeout) or _TIMEOUT_CAUSES.intersection(causes):
        return UpstreamTimeout("upstream: the provider did not answer in time")
    if _CONNECTION_CAUSES.intersection(causes):
        return UpstreamUnavailable("upstream: the provider could not be reached")
    status = getattr(exc, "status_code", None)
    headers: dict[str, str] = {}
    response = getattr(exc, "response", None)
    retry_after = getattr(getattr(response, "headers", None), "get", lambda _k: None)("retry-after") or (
        getattr(exc, "litellm_response_headers", None) or {}).get("retry-after")
    if retry_after:
        headers["retry-after"] = str(retry_after)
    if isinstance(exc, litellm.APIConnectionError) or not isinstance(status, int):
        return UpstreamUnavailable("upstream: the request to the provider failed", headers=headers)
    if status == 500 and getattr(exc, "litellm_response_headers", None) is None:
        # LiteLLM reports a 200 it could not read (truncated JSON, HTML, no choices) as its own 500;
        # a real upstream 500 carries the upstream's headers.
        return UpstreamInvalidResponse("upstream: the answer is not a chat completion" + (f": {said}" if said else ""))
    return upstream_error_for_status(status, f"upstream: {said or f'the provider answered {status}'}", headers)
