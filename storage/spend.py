"""Spend counters (USD) per budget period: Redis (shared by replicas) or memory.

A counter is seeded from the database's recorded costs the first time it is
read in its period (`seed` sets it only if absent), and a run's cost is added
only to counters that exist (`add`): a cost added before anyone seeded the
counter is in the database already and reaches the counter with the seed. So
the counter is the period's recorded spend, give or take the runs that finish
while a seed is being read; Redis being flushed costs one re-seed, not the
period's spend.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Protocol, Sequence

import redis.asyncio as aioredis


class SpendCounters(Protocol):
    async def get(self, names: Sequence[str]) -> list[float | None]:
        """Each counter's value; None where it was never seeded (or expired)."""

    async def seed(self, name: str, value: float, ttl_seconds: int) -> None:
        """Set the counter to `value` unless it exists."""

    async def add(self, names: Sequence[str], amount: float) -> None:
        """Add `amount` to each counter that exists."""

    async def close(self) -> None: ...


class MemorySpendCounters:
    """For one process; names carry their period, and a counter is dropped when its period is over."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._values: dict[str, float] = {}
        self._expiry: dict[str, float] = {}
        self._lock = asyncio.Lock()
        self._clock = clock

    async def get(self, names: Sequence[str]) -> list[float | None]:
        return [self._values.get(name) for name in names]

    async def seed(self, name: str, value: float, ttl_seconds: int) -> None:
        async with self._lock:
            now = self._clock()
            for stale in [n for n, at in self._expiry.items() if at <= now]:
                self._values.pop(stale, None)
                del self._expiry[stale]
            if name not in self._values:
                self._values[name] = value
                self._expiry[name] = now + ttl_seconds

    async def add(self, names: Sequence[str], amount: float) -> None:
        async with self._lock:
            for name in names:
                if name in self._values:
                    self._values[name] += amount

    async def close(self) -> None:
        return None


# INCRBYFLOAT on the counters that exist, in one round trip and atomically.
_ADD_EXISTING = """
for _, name in ipairs(KEYS) do
  if redis.call('exists', name) == 1 then redis.call('incrbyfloat', name, ARGV[1]) end
end
return 0
"""


class RedisSpendCounters:
    def __init__(self, url: str, prefix: str = "gw:spend:") -> None:
        self._redis = aioredis.from_url(url)
        self._prefix = prefix
        self._add = self._redis.register_script(_ADD_EXISTING)

    async def get(self, names: Sequence[str]) -> list[float | None]:
        values = await self._redis.mget([self._prefix + name for name in names])
        return [float(v) if v is not None else None for v in values]

    async def seed(self, name: str, value: float, ttl_seconds: int) -> None:
        await self._redis.set(self._prefix + name, repr(float(value)), nx=True, ex=ttl_seconds)

    async def add(self, names: Sequence[str], amount: float) -> None:
        await self._add(keys=[self._prefix + name for name in names], args=[repr(float(amount))])

    async def close(self) -> None:
        await self._redis.aclose()
