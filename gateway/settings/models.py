"""The `models:` and `router:` sections: the deployments a model name is served by (LiteLLM's
parameters, checked for what the gateway refuses to pass on) and how requests are spread and retried
over them."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from gateway.settings.strict import Strict
from gateway.upstream.deployment_params import refusal
from gateway.upstream.provider_names import provider_problem


class ModelSettings(Strict):
    """One deployment: entries that share a `name` are deployments of one model (gateway/upstream/deployments.py)."""

    name: str = Field(min_length=1)
    litellm_params: dict[str, Any]
    provider: str | None = None  # for privacy rules; default: the prefix of litellm_params.model
    # The deployment's id in run records, logs and cooldowns; default `<name>#<n>`, n counting the
    # entries of that name from 1 (so a config's order gives every replica the same ids).
    id: str | None = Field(None, min_length=1, max_length=128)

    @property
    def provider_name(self) -> str:
        if self.provider:
            return self.provider
        if self.litellm_params.get("custom_llm_provider"):
            return str(self.litellm_params["custom_llm_provider"])
        model = str(self.litellm_params["model"])
        return model.split("/", 1)[0] if "/" in model else "openai"

    @field_validator("litellm_params")
    @classmethod
    def _needs_model(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(value.get("model"), str) or not value["model"]:
            raise ValueError("litellm_params.model is required (e.g. openai/gpt-4o-mini)")
        unknown_provider = provider_problem(value["model"], value.get("custom_llm_provider"))
        if unknown_provider:
            raise ValueError(unknown_provider)
        for key in value:
            problem = refusal(str(key))
            if problem:
                raise ValueError(problem)
        for key in ("rpm", "tpm", "order"):
            if key in value and (isinstance(value[key], bool) or not isinstance(value[key], int) or value[key] < 1):
                raise ValueError(f"litellm_params.{key} must be a whole number of at least 1")
        for key in ("weight", "timeout", "stream_timeout"):
            if key in value and (isinstance(value[key], bool) or not isinstance(value[key], (int, float))
                                 or not value[key] > 0):
                raise ValueError(f"litellm_params.{key} must be a number above 0")
        return value


class RouterSettings(Strict):
    """How requests are spread over a model's deployments and retried (LiteLLM Router's settings).

    A request is retried on 429, 5xx, timeouts and refused connections before the first byte reaches
    the client, on another deployment of the model when one is healthy; once the model's tries are
    spent, on each of its `fallbacks` in turn. A deployment that fails more than `allowed_fails`
    times in a minute (a 429 counts at once when the model has other deployments) rests for
    `cooldown_time` seconds.
    """

    # LiteLLM's strategies: simple-shuffle (weight, else rpm/tpm as weights), least-busy, latency-based,
    # usage-based (tokens this minute), cost-based; always the lowest `order` first (gateway/upstream/deployments.py).
    routing_strategy: Literal["simple-shuffle", "least-busy", "latency-based-routing", "usage-based-routing",
                              "usage-based-routing-v2", "cost-based-routing"] = "simple-shuffle"
    num_retries: int = Field(2, ge=0, le=10)
    retry_after: float = Field(0.0, ge=0)  # seconds to wait at least before retrying the same deployment
    timeout: float | None = Field(None, gt=0)  # per call; default server.upstream_timeout_seconds
    allowed_fails: int = Field(3, ge=0)
    cooldown_time: float = Field(60.0, ge=0)
    fallbacks: list[dict[str, list[str]]] = Field(default_factory=list)
    context_window_fallbacks: list[dict[str, list[str]]] = Field(default_factory=list)

    def fallbacks_for(self, name: str, context_window: bool = False) -> list[str]:
        for entry in self.context_window_fallbacks if context_window else self.fallbacks:
            if name in entry:
                return list(entry[name])
        return []
