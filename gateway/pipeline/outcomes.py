"""How a run ended, and what it cost against what the client's transcript would have cost.

The counterfactual is priced the way the forwarded request was: the provider's
own prompt count, plus the tokens the projection removed; where the provider
reported cache hits for the request, the client's transcript is taken to hit
the cache on its previous request's transcript (agents only append), as a
cached replay does.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway.errors import GatewayError
from gateway.exchange import Completion
from gateway.upstream.seam import Prices
from storage.record_types import RunOutcome


@dataclass(frozen=True)
class Accounting:
    prices: Prices | None
    tokens_original: int
    tokens_forwarded: int
    previous_original: int  # the client's transcript tokens on this conversation's previous request
    # The deployment answers offline (`litellm_params.mock_response`, the demo model): LiteLLM's mock
    # reports a made-up prompt count (10), so the run is counted with the tokens forwarded instead.
    offline: bool = False


def offline_deployment(litellm_params: Any) -> bool:
    return "mock_response" in litellm_params


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def costs(accounting: Accounting, usage: dict[str, Any]) -> tuple[float | None, float | None, int]:
    """(cost as forwarded, cost of the client's transcript, cache-write tokens)."""
    prompt = _int(usage.get("prompt_tokens")) or 0
    completion = _int(usage.get("completion_tokens")) or 0
    details = usage.get("prompt_tokens_details") or {}
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    written = _int(usage.get("cache_creation_input_tokens")) or 0
    if accounting.prices is None:
        return None, None, written
    forwarded = accounting.prices.cost(prompt, completion, cached or 0, written)
    original_prompt = prompt + max(0, accounting.tokens_original - accounting.tokens_forwarded)
    # Only where the provider's cache was in play for this request (it reported hits)
    # is the client's transcript credited with hits on its previous request.
    original_cached = min(accounting.previous_original, original_prompt) if cached else 0
    original_written = max(0, original_prompt - original_cached) if written else 0
    original = accounting.prices.cost(original_prompt, completion, original_cached, original_written)
    return forwarded, original, written


def success(completion: Completion, started: float, accounting: Accounting) -> RunOutcome:
    usage = completion.usage or {}
    if accounting.offline:
        completed = _int(usage.get("completion_tokens")) or 0
        usage = {**usage, "prompt_tokens": accounting.tokens_forwarded,
                 "total_tokens": accounting.tokens_forwarded + completed}
    details = usage.get("prompt_tokens_details") or {}
    cost, cost_original, written = costs(accounting, usage)
    return RunOutcome(
        status="ok",
        http_status=200,
        latency_ms=(time.perf_counter() - started) * 1000,
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        total_tokens=_int(usage.get("total_tokens")),
        cached_tokens=_int(details.get("cached_tokens")) if isinstance(details, dict) else None,
        cache_write_tokens=written or None,
        cost_usd=cost,
        cost_original_usd=cost_original,
        tokens_original=accounting.tokens_original,
        tokens_forwarded=accounting.tokens_forwarded,
        finish_reason=completion.finish_reason,
        response=completion.body,
    )


def failure(error: GatewayError, started: float, accounting: Accounting | None = None,
            status: str = "error") -> RunOutcome:
    return RunOutcome(
        status=status,
        http_status=error.status_code,
        latency_ms=(time.perf_counter() - started) * 1000,
        error_type=error.code or error.error_type,
        error_message=error.detail or error.message,
        tokens_original=accounting.tokens_original if accounting else None,
        tokens_forwarded=accounting.tokens_forwarded if accounting else None,
    )
