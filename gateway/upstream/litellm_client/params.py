"""What a client's request body may set on a LiteLLM call: one rule for every endpoint (issue 27).

A body field reaches LiteLLM by name only when it is a documented parameter of the API the client
speaks: `NAMED` holds one allowlist per API, here and nowhere else. Any other field goes to the
provider inside the request body (LiteLLM's `extra_body`), never as an option of the call, an
upstream header, a credential or an endpoint, with one exception: a field whose name LiteLLM itself
takes as an option of a call (`LITELLM_OPTIONS`: credentials, endpoints, headers, providers, retries,
mocks, callbacks, routing, read from LiteLLM's own signatures and parameter models) is refused with
a 400 naming it. Such a name must not even travel in `extra_body`, because some of LiteLLM's paths read
keys back out of it (Azure takes `azure_ad_token` from it; the Responses bridge lifts fields out of it
into the call). A client that needs a provider option gets it through the deployment's config.

A documented field that LiteLLM reads as an option of its own under the same name goes in the body
too (Chat Completions' `metadata`: `litellm.completion` takes it as its logging and routing metadata).
On Anthropic Messages, gateway/upstream/litellm_client/anthropic_fields.py carries the body's fields to a native deployment,
which LiteLLM sends no `extra_body`. One value is refused as well: a tool naming LiteLLM Proxy's MCP
gateway (`server_url: litellm_proxy...`), which LiteLLM would try to expand in this process.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Mapping

from litellm.anthropic_interface import messages as anthropic_messages
from litellm.responses.mcp.tool_precheck import may_name_litellm_mcp_gateway
from litellm.types.router import GenericLiteLLMParams, LiteLLM_Params
from litellm.types.utils import all_litellm_params

from gateway.errors import InvalidRequest
from gateway.upstream.litellm_client.base import litellm
from policies.memo import memo

# OpenAI's documented Chat Completions parameters LiteLLM maps for the deployment's provider (or
# refuses, for a provider it cannot map them to).
CHAT = frozenset(
    {
        "messages", "tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p", "n", "stop",
        "max_tokens", "max_completion_tokens", "presence_penalty", "frequency_penalty", "logit_bias", "user",
        "response_format", "seed", "logprobs", "top_logprobs", "stream_options", "functions", "function_call",
        "modalities", "prediction", "audio", "reasoning_effort", "verbosity", "safety_identifier", "service_tier",
        "store", "prompt_cache_key", "prompt_cache_retention", "web_search_options",
    }
)
# Chat parameters LiteLLM documents beyond OpenAI's: by name where the provider's config maps them.
CHAT_MAPPED = frozenset({"thinking", "top_k", "include_server_side_tool_invocations"})
# OpenAI's Responses parameters `litellm.responses` takes by name.
RESPONSES = frozenset(
    {
        "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "reasoning", "include",
        "prompt_cache_key", "prompt_cache_retention", "store", "metadata", "max_output_tokens", "temperature",
        "top_p", "truncation", "user", "service_tier", "safety_identifier", "max_tool_calls", "top_logprobs",
    }
)
# Anthropic's documented Messages parameters (`litellm.anthropic.messages.acreate`).
MESSAGES = frozenset(
    {
        "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "tools",
        "tool_choice", "thinking", "metadata", "context_management", "output_format", "output_config",
        "service_tier", "container", "mcp_servers", "inference_geo", "speed", "cache_control",
    }
)
# OpenAI's documented embeddings and (legacy) completions parameters.
EMBEDDINGS = frozenset({"input", "dimensions", "encoding_format", "user"})
COMPLETIONS = frozenset(
    {
        "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
        "presence_penalty", "stop", "stream_options", "suffix", "temperature", "top_p", "user",
    }
)
# Google's documented generateContent fields (`litellm.google_genai`; gateway/upstream/litellm_client/gemini.py
# names three of them, sends the others in the body).
GENERATE_CONTENT = frozenset({"contents", "tools", "toolConfig", "systemInstruction", "generationConfig",
                              "safetySettings", "cachedContent", "labels"})
NAMED: Mapping[str, frozenset[str]] = {"chat": CHAT | CHAT_MAPPED, "responses": RESPONSES, "messages": MESSAGES,
                                       "embeddings": EMBEDDINGS, "completions": COMPLETIONS,
                                       "generate_content": GENERATE_CONTENT}
# Documented fields of these APIs that are no named parameter of the LiteLLM function an API calls, but
# share a name with an argument of another: sent in the body (Responses' `background`, `conversation`,
# `prompt`; a Chat Completions `metadata`, which `litellm.completion` takes as its own metadata).
IN_BODY = frozenset({"metadata", "background", "conversation", "prompt", "previous_response_id"})
_DOCUMENTED = frozenset().union(*NAMED.values(), IN_BODY)


def _parameters(function: Callable[..., Any]) -> set[str]:
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return {p.name for p in inspect.signature(function).parameters.values() if p.kind not in kinds}


def litellm_option_names() -> frozenset[str]:
    """Every name LiteLLM takes as an argument of the calls the gateway makes, or of a deployment."""
    functions: Iterable[Callable[..., Any]] = (
        litellm.completion, litellm.acompletion, litellm.embedding, litellm.text_completion, litellm.responses,
        litellm.aresponses, anthropic_messages.acreate, litellm.main.completion, litellm.main.embedding,
        litellm.google_genai.agenerate_content, litellm.google_genai.agenerate_content_stream)
    names = set().union(*map(_parameters, functions))
    names |= set(LiteLLM_Params.model_fields) | set(GenericLiteLLMParams.model_fields) | set(all_litellm_params)
    return frozenset(names)


# LiteLLM's options that are no documented field of the gateway's APIs: refused in a body.
LITELLM_OPTIONS = litellm_option_names() - _DOCUMENTED


_OPENAI_WIRE = frozenset({"openai", "custom_openai", "text-completion-openai", *litellm.openai_compatible_providers})


@memo(maxsize=256)
def chat_by_name(model: str, custom_provider: str | None) -> Callable[[str], bool]:
    """Which chat fields LiteLLM takes by name for a deployment: OpenAI's documented ones (`CHAT`) it maps
    for the provider (all of them, for a provider of another wire format: LiteLLM maps them or refuses
    one), and LiteLLM's own (`CHAT_MAPPED`) where it maps them; any other goes as sent."""
    try:
        name, provider, _key, _base = litellm.get_llm_provider(model, custom_llm_provider=custom_provider)
        supported = frozenset(litellm.get_supported_openai_params(model=name, custom_llm_provider=provider) or ())
    except Exception:  # an unknown provider: LiteLLM decides on every documented field
        supported, provider = CHAT, ""
    openai_wire = provider in _OPENAI_WIRE

    def by_name(key: str) -> bool:
        return key == "messages" or (key in CHAT and (key in supported or not openai_wire)) or (
            key in CHAT_MAPPED and key in supported)
    return by_name


def refused(key: str) -> bool:
    """A body field no request may carry: one of LiteLLM's options, or a private name (LiteLLM's
    internal switches start with `_`)."""
    return key in LITELLM_OPTIONS or key.startswith("_")


def split_body(body: Mapping[str, Any], by_name: Callable[[str], bool]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The body's fields LiteLLM takes by name (`by_name`), and those sent in the request body; an
    InvalidRequest (400) naming every field that is one of LiteLLM's options."""
    _check_tools(body.get("tools"))
    named: dict[str, Any] = {}
    in_body: dict[str, Any] = {}
    for key, value in body.items():
        if by_name(key):
            named[key] = value
        else:
            in_body[key] = value
    refusals = [key for key in in_body if refused(key)]
    if refusals:
        plural = "s" if len(refusals) > 1 else ""
        raise InvalidRequest(f"Unrecognized request argument{plural} supplied: {', '.join(refusals)} (the upstream "
                             "call is set by the gateway's configuration, not by a request)", param=refusals[0],
                             code="unknown_parameter")
    return named, in_body


def _check_tools(tools: Any) -> None:
    """An InvalidRequest for a tool that names LiteLLM Proxy's MCP gateway (`server_url: litellm_proxy...`),
    which LiteLLM would expand with the proxy's own MCP servers: this gateway runs no such thing."""
    if not isinstance(tools, list) or not may_name_litellm_mcp_gateway(tools):
        return
    index = next((i for i, tool in enumerate(tools) if may_name_litellm_mcp_gateway([tool])), 0)
    raise InvalidRequest(f"tools[{index}].server_url: LiteLLM Proxy's MCP gateway is not served here; give the MCP "
                         "server's own URL", param=f"tools[{index}].server_url", code="invalid_value")
