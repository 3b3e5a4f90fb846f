"""What a deployment's `litellm_params` may hold: every key either works or is refused by name.

LiteLLM Proxy passes any key on to `litellm.completion` and ignores the ones
nothing reads, so a misspelt `api_bse` or a `max_budget` that is never enforced
fails silently. Here each key is one of:

- a routing key the gateway honours itself (`rpm`, `tpm`, `weight`, `order`,
  `timeout`, `stream_timeout`: gateway/upstream/deployments.py), never sent to LiteLLM;
- a price the gateway prices runs with (`PRICING_KEYS`), never sent either;
- a key passed to LiteLLM's call (credentials, endpoints, provider options,
  default request parameters);
- refused, with the reason and what to use instead.

No LiteLLM import here: the config is checked without loading it
(tests/gateway/upstream/test_deployments.py checks these names against LiteLLM's own).
"""
from __future__ import annotations

import difflib

ROUTING_KEYS = frozenset({"rpm", "tpm", "weight", "order", "timeout", "stream_timeout"})

PRICING_KEYS = frozenset(
    {"input_cost_per_token", "output_cost_per_token", "cache_read_input_token_cost",
     "cache_creation_input_token_cost"}
)

# Credentials, endpoints and provider options LiteLLM's call takes.
_CONNECTION_KEYS = frozenset(
    {
        "model", "api_key", "api_base", "base_url", "api_version", "organization", "custom_llm_provider",
        "extra_headers", "extra_body", "drop_params", "mock_response", "merge_reasoning_content_in_choices",
        "use_chat_completions_api", "responses_api_version", "region_name", "tenant_id", "client_id",
        "client_secret", "azure_ad_token", "azure_username", "azure_password", "azure_scope",
        "vertex_project", "vertex_location", "vertex_credentials", "watsonx_region_name",
        "thought_signature_in_tool_call_id", "keepalive_seconds",
    }
)
# Provider credential families (aws_region_name, aws_role_name, vertex_ai_..., ...).
_CONNECTION_PREFIXES = ("aws_", "vertex_", "azure_", "watsonx_")

# Request parameters a deployment may set as defaults (a request's own value wins).
_DEFAULT_REQUEST_KEYS = frozenset(
    {
        "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "stop", "seed",
        "presence_penalty", "frequency_penalty", "reasoning_effort", "verbosity", "service_tier", "user",
        "parallel_tool_calls", "response_format", "thinking", "logprobs", "top_logprobs", "n",
    }
)

_REFUSED = {
    "max_retries": "retries are the router's: set router.num_retries",
    "num_retries": "retries are the router's: set router.num_retries",
    "max_budget": "budgets are set per tenant (tenants[].budget) or per key (POST /api/keys)",
    "budget_duration": "budgets are set per tenant (tenants[].budget) or per key (POST /api/keys)",
    "rpd": "requests per day are not enforced per deployment; use rpm, or tenant limits",
    "tpd": "tokens per day are not enforced per deployment; use tpm, or tenant limits",
    "itpm": "input tokens per minute are not enforced per deployment; use tpm",
    "otpm": "output tokens per minute are not enforced per deployment; use tpm",
    "max_parallel_requests": "parallel request caps are not enforced per deployment; use rpm",
    "model_info": "model_info belongs beside litellm_params, not inside it (and is not read)",
    "tags": "tag-based routing is not supported; give the deployments different model names",
    "use_in_pass_through": "pass-through routes are not served by this gateway",
    "litellm_credential_name": "credentials are given in the deployment itself (os.environ/NAME)",
    "timeout_by_service_tier": "set timeout and stream_timeout",
    "stream_timeout_by_service_tier": "set timeout and stream_timeout",
}
_KNOWN = ROUTING_KEYS | PRICING_KEYS | _CONNECTION_KEYS | _DEFAULT_REQUEST_KEYS


def passed_to_litellm(key: str) -> bool:
    """Whether a (valid) litellm_params key goes to LiteLLM's call."""
    return key not in ROUTING_KEYS and key not in PRICING_KEYS


def refusal(key: str) -> str | None:
    """Why a litellm_params key is refused, or None if it works."""
    if key in _KNOWN or key.startswith(_CONNECTION_PREFIXES):
        return None
    if key in _REFUSED:
        return f"litellm_params.{key} is not supported: {_REFUSED[key]}"
    if "cost" in key:
        return (f"litellm_params.{key} is not supported: runs are priced with "
                + ", ".join(sorted(PRICING_KEYS)))
    close = difflib.get_close_matches(key, sorted(_KNOWN), n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"litellm_params.{key} is not a parameter the gateway or LiteLLM reads{hint}"


def accepted_names() -> frozenset[str]:
    """Every exact key accepted (for the test that LiteLLM reads them)."""
    return _KNOWN
