"""LiteLLM's Router as the gateway's deployment picker: its routing strategy (weights, `order`) and its
cooldowns, without its transport.

The gateway makes each call itself (the direct transport or `litellm.acompletion`,
gateway/upstream/litellm_client/client.py) and retries on its own terms (gateway/upstream/deployments.py),
so the Router is asked only two things: which deployment of a model to try
(`Router.select`), and that a deployment failed (`health().record_failure`),
which is how its cooldowns learn. Models with a single deployment never reach it.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from gateway.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable
from gateway.upstream.litellm_client.base import litellm

# What the Router reads of a deployment to pick it (it makes no call, so no credentials).
_PICKED_BY = ("weight", "order", "rpm", "tpm")


class RouterPicker:
    """One `litellm.Router` over every model that has several deployments, each under a group name of
    its own (a wildcard name such as `claude-*` means nothing to the Router's own pattern routing)."""

    def __init__(self, groups: Mapping[str, Sequence[tuple[str, Mapping[str, Any]]]], *, allowed_fails: int,
                 cooldown_time: float) -> None:
        self._group: dict[str, str] = {}
        self._members: dict[str, list[str]] = {}
        model_list = []
        for index, (name, deployments) in enumerate(groups.items()):
            self._group[name] = f"group-{index}"
            self._members[name] = [deployment_id for deployment_id, _ in deployments]
            for deployment_id, params in deployments:
                picked = {key: params[key] for key in _PICKED_BY if key in params}
                model_list.append({"model_name": f"group-{index}",
                                   "litellm_params": {"model": f"openai/{deployment_id}", **picked},
                                   "model_info": {"id": deployment_id}})
        self._router = litellm.Router(model_list=model_list, num_retries=0, allowed_fails=allowed_fails,
                                      cooldown_time=cooldown_time, routing_strategy="simple-shuffle") \
            if model_list else None

    async def pick(self, name: str) -> str | None:
        """A deployment id of model `name` by the Router's strategy, None when all are cooling down."""
        if self._router is None or name not in self._group:
            return None
        try:
            picked = await self._router.select(self._group[name], kind="pick", messages=[])
        except Exception:  # every deployment cooling down: LiteLLM raises; the caller decides
            return None
        return str((picked.get("model_info") or {}).get("id")) if picked else None

    async def cooling(self, name: str) -> set[str]:
        """The deployments of model `name` cooling down now."""
        members = self._members.get(name)
        if self._router is None or not members:
            return set()
        try:
            active = await self._router.health().cooldowns.async_get_active_cooldowns(members, None)
        except Exception:  # the cooldown store unreadable: nothing known to be cooling
            return set()
        return {str(deployment_id) for deployment_id, _ in active}

    def failed(self, deployment_id: str, error: UpstreamError) -> bool:
        """Tell the Router a deployment failed; True if that put it in cooldown."""
        if self._router is None:
            return False
        try:
            return bool(self._router.health().record_failure(deployment_id, _litellm_error(error),
                                                             error.status_code))
        except Exception:  # a deployment the Router does not hold (a single one): nothing to cool
            return False


def _litellm_error(error: UpstreamError) -> Exception:
    """The LiteLLM exception the Router's cooldown rules read for an upstream failure."""
    message, provider, model = error.message, "openai", "deployment"
    if isinstance(error, UpstreamTimeout):
        return litellm.Timeout(message, model=model, llm_provider=provider)
    if isinstance(error, UpstreamUnavailable):
        return litellm.APIConnectionError(message, llm_provider=provider, model=model)
    status = error.status_code
    kinds = {429: litellm.RateLimitError, 401: litellm.AuthenticationError, 404: litellm.NotFoundError,
             503: litellm.ServiceUnavailableError}
    kind = kinds.get(status)
    if kind is not None:
        return kind(message, llm_provider=provider, model=model)
    return litellm.InternalServerError(message, llm_provider=provider, model=model)
