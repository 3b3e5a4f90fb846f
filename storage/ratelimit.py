"""Per-tenant rate limits in fixed one-minute windows: Redis (shared by replicas) or memory.

`hit(key, amount, limit)` adds `amount` to the current window's count and says
whether the count is still within `limit`, how much is left, and how many
seconds remain until the window resets. `FallbackRateLimiter` counts in Redis
while it answers and in the process while it does not (see storage/redis_link.py).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:  # imported by a Redis-backed instance only (see storage/redis_link.py)
    import redis.asyncio as aioredis

from storage.redis_link import RedisLink, Refusal, plain_client

WINDOW_SECONDS = 60


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    limit: int
    remaining: int
    reset_seconds: int


class RateLimiter(Protocol):
    async def hit(self, key: str, amount: int, limit: int) -> Verdict: ...

    async def close(self) -> None: ...


def _window(now: float) -> tuple[int, int]:
    start = int(now // WINDOW_SECONDS) * WINDOW_SECONDS
    return start, max(1, start + WINDOW_SECONDS - int(now))


class MemoryRateLimiter:
    """For one process (the embedded default)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._counts: dict[tuple[str, int], int] = {}
        self._lock = asyncio.Lock()
        self._clock = clock

    async def hit(self, key: str, amount: int, limit: int) -> Verdict:
        window, reset = _window(self._clock())
        async with self._lock:
            for stale in [k for k in self._counts if k[1] < window]:
                del self._counts[stale]
            count = self._counts.get((key, window), 0) + amount
            self._counts[(key, window)] = count
        return Verdict(count <= limit, limit, max(0, limit - count), reset)

    async def close(self) -> None:
        return None


class RedisRateLimiter:
    """Shared by every replica: INCRBY on a per-window key that expires with the window."""

    def __init__(self, url: str | aioredis.Redis, prefix: str = "gw:rl:", clock: Callable[[], float] = time.time) -> None:
        self._owned = isinstance(url, str)  # a client passed in is closed by whoever made it
        self._redis = plain_client(url) if isinstance(url, str) else url
        self._prefix = prefix
        self._clock = clock

    async def hit(self, key: str, amount: int, limit: int) -> Verdict:
        window, reset = _window(self._clock())
        name = f"{self._prefix}{key}:{window}"
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.incrby(name, amount)
            pipe.expire(name, WINDOW_SECONDS * 2)
            count, _ = await pipe.execute()
        return Verdict(int(count) <= limit, limit, max(0, limit - int(count)), reset)

    async def close(self) -> None:
        if self._owned:
            await self._redis.aclose()


class FallbackRateLimiter:
    """Redis's counts while it answers. While it does not, this process's own counts (so each replica
    allows the whole limit), or, given `refuse`, the error it makes."""

    def __init__(self, link: RedisLink, prefix: str = "gw:rl:", clock: Callable[[], float] = time.time,
                 refuse: Refusal | None = None) -> None:
        self.link = link
        self.shared = RedisRateLimiter(link.client, prefix=prefix, clock=clock)
        self.local = MemoryRateLimiter(clock)
        self._refuse = refuse

    async def hit(self, key: str, amount: int, limit: int) -> Verdict:
        return await self.link.shared_or_local(lambda: self.shared.hit(key, amount, limit),
                                               lambda: self.local.hit(key, amount, limit), self._refuse)

    async def close(self) -> None:
        return None  # the link is closed by its owner
