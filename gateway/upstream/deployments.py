"""Deployments: one model name served by several config entries, with retries, fallbacks and cooldowns.

`RoutedUpstream` wraps the upstream client. For each call it picks a deployment
of the requested model (LiteLLM's Router decides among several: weights,
`order`, cooldowns; gateway/upstream/litellm_client/router.py), skips those at their `rpm` or
`tpm` (counted in the rate limiter, so replicas sharing Redis share the count),
and calls it with that deployment's parameters and timeout. A failure before
the first byte reaches the client is retried, as LiteLLM Proxy retries:

- on 429, 5xx, timeouts and refused connections, up to `router.num_retries`
  more tries, on another healthy deployment when there is one (at once), else
  on the same after a backoff (the provider's `retry-after` when it gives one
  up to 30 s, else 0.5 s doubling, at least `router.retry_after`);
- then on each of the model's `router.fallbacks` in turn (those the tenant may
  use), each with its own tries; a context-window error goes to
  `router.context_window_fallbacks` instead;
- a request the provider refuses as malformed (other 4xx) is not retried.

Every try is recorded on the request's attempt log (`UpstreamRequest.attempts`),
which the run record keeps: which deployment answered, and each failure before it.
A stream that fails after its first event is reported to the client, never retried.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Protocol

from gateway.config import ModelSettings, Settings
from gateway.errors import (
    RateLimitExceeded,
    UpstreamError,
    UpstreamInvalidResponse,
    UpstreamRateLimited,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.upstream.deployment_params import ROUTING_KEYS
from gateway.upstream.seam import Api, Attempt, UpstreamClient, UpstreamRequest, WrappedUpstream, close_stream
from storage.ratelimit import RateLimiter

_MAX_PROVIDER_WAIT = 30.0  # seconds of a provider's retry-after the gateway waits out before retrying
_FIRST_BACKOFF = 0.5
_MAX_BACKOFF = 8.0


class Picker(Protocol):
    async def pick(self, name: str) -> str | None: ...

    async def cooling(self, name: str) -> set[str]: ...

    def failed(self, deployment_id: str, error: UpstreamError) -> bool: ...


@dataclass(frozen=True)
class Deployment:
    id: str
    entry: ModelSettings

    @property
    def call_params(self) -> dict[str, Any]:
        """What LiteLLM is given: the entry's params without the keys routing reads."""
        return {k: v for k, v in self.entry.litellm_params.items() if k not in ROUTING_KEYS}

    def timeout(self, stream: bool, default: float) -> float:
        params = self.entry.litellm_params
        chosen = params.get("stream_timeout") if stream else None
        return float(chosen or params.get("timeout") or default)


def retryable(error: UpstreamError) -> bool:
    """A failure another try may not meet: rate limits, the provider's own faults, timeouts, no connection."""
    return isinstance(error, (UpstreamRateLimited, UpstreamTimeout, UpstreamUnavailable, UpstreamInvalidResponse)) \
        or error.status_code >= 500 or error.status_code == 408


def _deployment_fault(error: UpstreamError) -> bool:
    """A failure of the deployment rather than of the request: worth a fallback and a cooldown."""
    return retryable(error) or error.status_code in (401, 403, 404)


def _context_window(error: UpstreamError) -> bool:
    text = error.message.lower()
    return error.status_code == 400 and ("context_length_exceeded" in text or "context window" in text
                                         or "maximum context length" in text or "prompt is too long" in text)


def _provider_wait(error: UpstreamError) -> float | None:
    value = error.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


_UNLIMITED = 2 ** 62
_LATENCY_WEIGHT = 0.3  # of the newest answer in the moving average


@dataclass
class Observed:
    """What this process saw of each deployment: calls in flight, and a moving average of answer latency."""

    in_flight: dict[str, int] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)

    def began(self, deployment_id: str) -> None:
        self.in_flight[deployment_id] = self.in_flight.get(deployment_id, 0) + 1

    def ended(self, deployment_id: str) -> None:
        self.in_flight[deployment_id] = max(0, self.in_flight.get(deployment_id, 0) - 1)

    def answered(self, deployment_id: str, latency_ms: float) -> None:
        before = self.latency_ms.get(deployment_id)
        self.latency_ms[deployment_id] = latency_ms if before is None else (
            _LATENCY_WEIGHT * latency_ms + (1 - _LATENCY_WEIGHT) * before)


class RoutedUpstream(WrappedUpstream):
    """An `UpstreamClient` that routes each call over the requested model's deployments."""

    def __init__(self, inner: UpstreamClient, settings: Settings, limiter: RateLimiter | None,
                 picker_factory: Callable[[Settings], Picker | None] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 observed: "Observed | None" = None) -> None:
        super().__init__(inner)
        self.settings = settings
        self._limiter = limiter
        self._sleep = sleep
        self._picker_factory = picker_factory or default_picker
        self._picker = self._picker_factory(settings)
        self._deployments: dict[str, list[Deployment]] = {}
        self.strategy = settings.router.routing_strategy
        self.observed = observed or Observed()  # kept across reloads

    def with_settings(self, settings: Settings) -> "RoutedUpstream":
        """The same client routing by a reloaded config (cooldowns start afresh)."""
        return RoutedUpstream(self.inner, settings, self._limiter, self._picker_factory, self._sleep,
                              self.observed)

    # The UpstreamClient interface: each call routed.
    async def call(self, api: Api, request: UpstreamRequest) -> dict[str, Any]:
        plan = _Plan(self, request, stream=False)
        while True:
            routed = await plan.next()
            started = time.perf_counter()
            try:
                answer = await self.inner.call(api, routed)
            except UpstreamError as error:
                await plan.failed(error, started)
                continue
            plan.answered(started)
            return answer

    async def stream(self, api: Api, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        plan = _Plan(self, request, stream=True)
        while True:
            routed = await plan.next()
            started = time.perf_counter()
            events = self.inner.stream(api, routed)
            try:
                first = await events.__anext__()
            except StopAsyncIteration:
                plan.answered(started)
                return
            except UpstreamError as error:
                await close_stream(events)
                await plan.failed(error, started)
                continue
            plan.answered(started, still_open=True)
            break
        try:
            yield first
            async for event in events:
                yield event
        finally:
            plan.closed()
            await close_stream(events)

    async def _pick(self, name: str, candidates: list[Deployment], tried: set[str],
                    tokens: int) -> Deployment | None:
        """A deployment of `name` to try: the Router's pick among those not tried in this request and
        not at their rpm/tpm, else any not at its limits (the same one again, after a backoff)."""
        by_id = {d.id: d for d in candidates}
        usable = [d for d in candidates if await self._under_limits(d)]
        if not usable:
            return None
        if len(candidates) == 1 or self._picker is None:
            fresh = [d for d in usable if d.id not in tried]
            chosen = (fresh or usable)[0]
        else:
            cooling = await self._picker.cooling(name)
            fresh = [d for d in usable if d.id not in tried and d.id not in cooling]
            chosen = None
            if self.strategy != "simple-shuffle" and fresh:
                chosen = await self._ranked(fresh)
            for _ in range(4 if chosen is None else 0):  # the Router's shuffle (weights, order), not cooling
                picked = await self._picker.pick(name)
                if picked is not None and by_id.get(picked) in fresh:
                    chosen = by_id[picked]
                    break
            if chosen is None:
                # The Router keeps picking what this request tried already (by `order`), or holds
                # everything in cooldown: another untried one by `order`, else the same again.
                fresh.sort(key=lambda d: d.entry.litellm_params.get("order", 0))
                chosen = fresh[0] if fresh else next((d for d in usable if d.id not in cooling), usable[0])
        await self._count(chosen, tokens)
        return chosen

    async def _ranked(self, fresh: list[Deployment]) -> Deployment:
        """The best of `fresh` (lowest `order` first) by the strategy, ties broken at random.

        LiteLLM's Router learns these from the calls it makes itself; the gateway makes its own, so
        it keeps the same measures: calls in flight in this process (least-busy), the recent average
        latency of answers (latency-based; a deployment not yet measured is tried first), tokens this
        minute in the shared rate counter (usage-based), and the price per token (cost-based)."""
        lowest = min(d.entry.litellm_params.get("order", 0) for d in fresh)
        first = [d for d in fresh if d.entry.litellm_params.get("order", 0) == lowest]
        scores = {d.id: await self._score(d) for d in first}
        best = min(scores.values())
        return random.choice([d for d in first if scores[d.id] == best])

    async def _score(self, deployment: Deployment) -> float:
        if self.strategy == "least-busy":
            return float(self.observed.in_flight.get(deployment.id, 0))
        if self.strategy == "latency-based-routing":
            return self.observed.latency_ms.get(deployment.id, 0.0)
        if self.strategy.startswith("usage-based-routing"):
            if self._limiter is None:
                return 0.0
            verdict = await self._limiter.hit(f"deployment:{deployment.id}:tokens", 0, _UNLIMITED)
            return float(_UNLIMITED - verdict.remaining)
        prices = self.prices(deployment.entry.litellm_params)  # cost-based-routing
        return prices.input + prices.output if prices is not None else float("inf")

    @staticmethod
    def _limits(deployment: Deployment) -> list[tuple[str, int]]:
        params = deployment.entry.litellm_params
        return [(kind, int(params[kind])) for kind in ("rpm", "tpm") if kind in params]

    async def _under_limits(self, deployment: Deployment) -> bool:
        """Whether the deployment is under its rpm and tpm this minute."""
        if self._limiter is None:
            return True
        for kind, limit in self._limits(deployment):
            verdict = await self._limiter.hit(f"deployment:{deployment.id}:{kind}", 0, limit)
            if verdict.remaining <= 0:
                return False
        return True

    async def _count(self, deployment: Deployment, tokens: int) -> None:
        """Count a call about to be made against the deployment's rpm and tpm (and, for usage-based
        routing, its tokens this minute)."""
        if self._limiter is None:
            return
        for kind, limit in self._limits(deployment):
            await self._limiter.hit(f"deployment:{deployment.id}:{kind}", 1 if kind == "rpm" else tokens, limit)
        if self.strategy.startswith("usage-based-routing"):
            await self._limiter.hit(f"deployment:{deployment.id}:tokens", tokens, _UNLIMITED)

    def deployments(self, name: str) -> list[Deployment]:
        found = self._deployments.get(name)
        if found is None:
            if len(self._deployments) > 4096:  # names a wildcard matched: not kept without bound
                self._deployments.clear()
            found = self._deployments[name] = [Deployment(i, entry) for i, entry in self.settings.deployments(name)]
        return found


class _Plan:
    """The tries of one call: the requested model's deployments, then its fallbacks."""

    def __init__(self, router: RoutedUpstream, request: UpstreamRequest, stream: bool) -> None:
        self.router = router
        self.request = request
        self.stream = stream
        settings = router.settings.router
        self.names = [request.alias]
        self.context_window_tried = False
        self.tries_left = settings.num_retries + 1
        self.tried: set[str] = set()
        self.current: Deployment | None = None
        self.error: UpstreamError | None = None
        self.wait = 0.0

    def _allowed(self, name: str) -> bool:
        return self.request.models_allowed is None or name in self.request.models_allowed

    async def next(self) -> UpstreamRequest:
        """The request for the next try, or the last error raised when no try is left."""
        while True:
            name = self.names[0]
            candidates = self.router.deployments(name)
            if self.tries_left > 0 and candidates:
                deployment = await self.router._pick(name, candidates, self.tried, self.request.tokens)
                if deployment is not None:
                    if self.error is not None and deployment.id in self.tried:
                        await self.router._sleep(self.wait)
                    self.tries_left -= 1
                    self.tried.add(deployment.id)
                    self.current = deployment
                    self.router.observed.began(deployment.id)
                    return self._routed(name, deployment)
                if self.error is None:
                    self.error = RateLimitExceeded(
                        f"Every deployment of model '{name}' is at its rpm or tpm limit; try again shortly.",
                        code="deployments_at_limit", headers={"retry-after": "1"})
            if not self._next_model():
                assert self.error is not None
                raise self.error

    def _next_model(self) -> bool:
        """Move on to the next fallback model; False when there is none."""
        settings = self.router.settings.router
        error = self.error
        if error is None:
            return False
        if isinstance(error, UpstreamError) and _context_window(error) and not self.context_window_tried:
            self.context_window_tried = True
            self.names = [self.names[0], *self._fallbacks(context_window=True)]
        elif len(self.names) == 1 and self.names[0] == self.request.alias and (
                not isinstance(error, UpstreamError) or _deployment_fault(error)):
            self.names = [self.names[0], *self._fallbacks(context_window=False)]
        if len(self.names) < 2:
            return False
        self.names = self.names[1:]
        self.tries_left = settings.num_retries + 1
        self.tried = set()
        return True

    def _fallbacks(self, context_window: bool) -> list[str]:
        """The requested model's fallbacks (declared for its name, or for the wildcard name it matched)."""
        settings = self.router.settings
        names = settings.router.fallbacks_for(self.request.alias, context_window)
        if not names:
            entry = settings.model(self.request.alias)
            names = settings.router.fallbacks_for(entry.name, context_window) if entry else []
        return [n for n in names if self._allowed(n) and n != self.request.alias]

    def _routed(self, name: str, deployment: Deployment) -> UpstreamRequest:
        default = self.router.settings.router.timeout or self.request.timeout_seconds
        return replace(self.request, alias=name, litellm_params=deployment.call_params,
                       timeout_seconds=deployment.timeout(self.stream, default))

    def _attempt(self, started: float, outcome: str, status: int | None) -> None:
        deployment = self.current
        assert deployment is not None
        self.request.attempts.append(Attempt(
            deployment=deployment.id, model=self.names[0],
            upstream_model=str(deployment.entry.litellm_params["model"]), outcome=outcome,
            http_status=status, latency_ms=round((time.perf_counter() - started) * 1000, 3),
            prices=self.router.prices(deployment.entry.litellm_params)))

    def answered(self, started: float, still_open: bool = False) -> None:
        """The try answered (a stream: its first event; `closed` follows when it ends)."""
        self._attempt(started, "ok", 200)
        assert self.current is not None
        self.router.observed.answered(self.current.id, (time.perf_counter() - started) * 1000)
        if not still_open:
            self.router.observed.ended(self.current.id)

    def closed(self) -> None:
        if self.current is not None:
            self.router.observed.ended(self.current.id)

    async def failed(self, error: UpstreamError, started: float) -> None:
        """Record the failure; raise it when it is not worth another try here or elsewhere."""
        self._attempt(started, error.code or error.error_type, error.status_code)
        deployment = self.current
        assert deployment is not None
        self.router.observed.ended(deployment.id)
        picker = self.router._picker
        if picker is not None and _deployment_fault(error) and len(self.router.deployments(self.names[0])) > 1:
            picker.failed(deployment.id, error)
        self.error = error
        if not retryable(error):
            self.tries_left = 0
            if not (_deployment_fault(error) or _context_window(error)):
                raise error
        provider_wait = _provider_wait(error)
        if provider_wait is not None and provider_wait > _MAX_PROVIDER_WAIT:
            self.tries_left = 0  # not this model again soon; a fallback may still answer
        tries_done = self.router.settings.router.num_retries + 1 - self.tries_left
        backoff = min(_MAX_BACKOFF, _FIRST_BACKOFF * 2 ** max(0, tries_done - 1))
        self.wait = max(self.router.settings.router.retry_after,
                        provider_wait if provider_wait is not None else backoff)


def default_picker(settings: Settings) -> Picker | None:
    """LiteLLM's Router over the models with several deployments (None when no model has)."""
    groups: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for deployment_id, entry in settings.deployment_ids():
        groups.setdefault(entry.name, []).append((deployment_id, entry.litellm_params))
    several = {name: members for name, members in groups.items() if len(members) > 1}
    if not several:
        return None
    from gateway.upstream.litellm_client.router import RouterPicker

    return RouterPicker(several, allowed_fails=settings.router.allowed_fails,
                        cooldown_time=settings.router.cooldown_time)
