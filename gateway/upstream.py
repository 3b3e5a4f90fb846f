"""The narrow interface to model providers: one call, streaming or not."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, Protocol


@dataclass(frozen=True)
class UpstreamRequest:
    """One chat completion to send: the config's model entry and the OpenAI body."""

    alias: str
    litellm_params: Mapping[str, Any]
    body: Mapping[str, Any]  # OpenAI fields except model and stream; messages are the projection
    timeout_seconds: float
    request_id: str
    extra_headers: Mapping[str, str] = field(default_factory=dict)


class UpstreamClient(Protocol):
    async def complete(self, request: UpstreamRequest) -> dict[str, Any]:
        """A chat.completion object as a plain dict; raises UpstreamError."""

    def stream(self, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        """chat.completion.chunk objects as plain dicts; raises UpstreamError."""

    def cost_usd(self, litellm_params: Mapping[str, Any], usage: Mapping[str, Any]) -> float | None:
        """What the usage cost under the provider's price map, if known."""
