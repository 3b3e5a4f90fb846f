"""What a deployment's tokens cost: its own prices in the config, else LiteLLM's price map.

`deployment_prices` reads `input_cost_per_token` (and the output, cache read and cache
write prices) from the deployment's litellm_params when it has them, else LiteLLM's
map for its model; `usage_cost` prices a run's usage (Chat's shape) with them.
"""
from __future__ import annotations

from typing import Any, Mapping

from gateway.upstream.litellm_client.base import litellm
from gateway.upstream.seam import Prices
from policies.memo import memo


def deployment_prices(litellm_params: Mapping[str, Any]) -> Prices | None:
    """The config's prices of a deployment, else LiteLLM's for its model (None: unpriced)."""
    if "input_cost_per_token" in litellm_params:
        price_in = float(litellm_params["input_cost_per_token"])
        return Prices(
            input=price_in,
            output=float(litellm_params.get("output_cost_per_token", 0.0)),
            cache_read=float(litellm_params.get("cache_read_input_token_cost", price_in)),
            cache_write=float(litellm_params.get("cache_creation_input_token_cost", price_in)),
        )
    return _map_prices(str(litellm_params["model"]))


def usage_cost(litellm_params: Mapping[str, Any], usage: Mapping[str, Any]) -> float | None:
    """A run's usage (Chat's shape) priced; None for a model without prices."""
    prices = deployment_prices(litellm_params)
    if prices is None:
        return None
    details = usage.get("prompt_tokens_details") or {}
    return prices.cost(
        prompt=int(usage.get("prompt_tokens") or 0),
        completion=int(usage.get("completion_tokens") or 0),
        cached=int(details.get("cached_tokens") or 0),
        cache_write=int(usage.get("cache_creation_input_tokens") or 0),
    )


def _model_info(model: str) -> dict[str, Any] | None:
    try:
        return dict(litellm.get_model_info(model))
    except Exception:  # a model LiteLLM has no price for
        return None


@memo(maxsize=256)
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
