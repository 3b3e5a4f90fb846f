"""What the gateway stands on (its database, Redis): checked at start, reported by `/readyz`, and what
a model request meets while Redis is away.

Redis holds the rate limits and spend counters that replicas share. While it does not answer, each
process counts on its own (`redis.when_down: local`, the default: storage/redis_link.py), or, once a
ping has confirmed the outage, model requests are answered 503 with Retry-After (`refuse`). Either way no call waits for Redis longer than
`redis.timeout_seconds`, and an outage is logged once when a ping confirms it and once when it ends
(metrics `gateway_redis_up`, `gateway_redis_outages_total`). A database that does not answer, at
start, or a Redis under `refuse`, stops the start with one line saying which and why.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable

from fastapi.responses import JSONResponse

from gateway.config import Settings
from gateway.errors import ServiceUnavailable
from gateway.ops.metrics import GatewayMetrics
from gateway.threads import aside
from storage.database import safe_url as database_url
from storage.database import unavailable
from storage.ratelimit import FallbackRateLimiter, MemoryRateLimiter, RateLimiter
from storage.records import RecordStore
from storage.redis_link import RedisDown, RedisLink, reason
from storage.redis_link import safe_url as redis_url
from storage.spend import FallbackSpendCounters, MemorySpendCounters, SpendCounters

log = logging.getLogger("gateway.outages")
READY_TIMEOUT_SECONDS = 5.0  # /readyz calls the database down past this


@dataclass(frozen=True)
class Counters:
    """The rate limiter and the spend counters, and the Redis link behind them (None without Redis)."""

    limiter: RateLimiter
    spend: SpendCounters
    redis: RedisLink | None = None

    async def start(self, settings: Settings) -> asyncio.Task[None] | None:
        """Ping Redis: down under `refuse`, `RedisDown`; else the task that pings it while it is down."""
        if self.redis is None:
            return None
        if not await self.redis.probe() and settings.redis.when_down == "refuse":
            raise RedisDown(self.redis.reason)
        return asyncio.create_task(self.redis.watch())

    async def close(self) -> None:
        await self.limiter.close()
        await self.spend.close()
        if self.redis is not None:
            await self.redis.close()


def counters(settings: Settings, metrics: GatewayMetrics, clock: Callable[[], float]) -> Counters:
    config = settings.redis
    if config.url is None:
        return Counters(MemoryRateLimiter(clock), MemorySpendCounters())
    url = config.url
    refusing = config.when_down == "refuse"

    def changed(up: bool, why: str | None) -> None:
        metrics.observe_redis(up)
        if up:
            log.warning("redis %s answers again: %s", redis_url(url),
                        "model requests are served again" if refusing else "rate limits and budgets are shared again")
        else:
            log.error("redis %s does not answer (%s): %s until it does", redis_url(url), why,
                      "model requests are refused (503)" if refusing else "rate limits and budgets count per process")

    link = RedisLink(url, timeout_seconds=config.timeout_seconds, on_change=changed)
    metrics.observe_redis(True)
    refuse = _refusal if refusing else None
    return Counters(FallbackRateLimiter(link, f"{config.key_prefix}rl:", clock, refuse),
                    FallbackSpendCounters(link, f"{config.key_prefix}spend:", refuse), link)


def _refusal(down: RedisDown) -> ServiceUnavailable:
    return ServiceUnavailable("Redis, which holds this gateway's shared rate limits and budgets, does not answer; "
                              "try again shortly.", code="redis_unavailable", detail=str(down))


async def readiness(store: RecordStore, redis: RedisLink | None, settings: Settings,
                    degraded_ok: bool = False) -> JSONResponse:
    """200 `ready` when all answers, else 503 naming what is down: `unavailable` when model requests
    cannot be served (the database; Redis under `refuse`), `degraded` while they are, on per-process
    limits (Redis away under `local`). `degraded_ok` (`/readyz?degraded=ok`, what the shipped load
    balancer probes ask): a degraded replica answers 200, so a Redis outage does not take every replica
    out of rotation at once."""
    down: list[str] = []
    try:
        await asyncio.wait_for(aside(store.ping), READY_TIMEOUT_SECONDS)
    except Exception:
        down.append("database")
    if redis is not None and not await redis.probe():
        down.append("redis")
    if not down:
        return JSONResponse({"status": "ready"})
    serving = down == ["redis"] and settings.redis.when_down == "local"
    return JSONResponse({"status": "degraded" if serving else "unavailable", "down": down},
                        status_code=200 if serving and degraded_ok else 503)


def check_at_start(settings: Settings, store: RecordStore, *, migrate: bool = False) -> None:
    """Raise what stops a start: the database or the blob store not answering (`migrate`: the schema
    brought up to date as well), Redis not answering under `refuse`."""
    if migrate:
        store.create_schema()
    else:
        store.ping()
    store.blobs.check()
    if settings.redis.url is not None and settings.redis.when_down == "refuse":
        asyncio.run(_redis_answers(settings.redis.url, settings.redis.timeout_seconds))


async def _redis_answers(url: str, timeout: float) -> None:
    link = RedisLink(url, timeout_seconds=timeout)
    try:
        if not await link.probe():
            raise RedisDown(link.reason)
    finally:
        await link.close()


def failure_line(exc: BaseException, settings: Settings) -> str:
    """What stopped the start, in one line: `database URL: why`, `redis URL: why`, or the error."""
    why = unavailable(exc)
    if why is not None:
        return f"database {database_url(settings.storage_url())}: {why}"
    if isinstance(exc, RedisDown) and settings.redis.url is not None:
        return f"redis {redis_url(settings.redis.url)}: {exc}"
    return f"{type(exc).__name__}: {reason(exc)}"
