"""Spend counters (USD) per budget period: Redis (shared by replicas) or memory.

A counter is seeded from the database's recorded costs the first time it is
read in its period (`seed` sets it only if absent), and a run's cost is added
only to counters that exist (`add`): a cost added before anyone seeded the
counter is in the database already and reaches the counter with the seed. So
the counter is the period's recorded spend, give or take the runs that finish
while a seed is being read; Redis being flushed costs one re-seed, not the
period's spend.

While Redis does not answer, `FallbackSpendCounters` counts in the process,
seeded from the database like the memory counters but for at most a minute at
a time, so each process re-reads the recorded spend of every replica that
often. A cost that could not reach Redis marks its counters; when Redis
answers again they are deleted there before anyone reads them, so their next
read re-seeds them from the database, which holds that cost. (Counters marked
by a process that stops during the outage stay short of its outage spend until
their period ends.)
"""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

if TYPE_CHECKING:  # imported by a Redis-backed instance only (see storage/redis_link.py)
    import redis.asyncio as aioredis

from storage.redis_link import RedisLink, Refusal, plain_client


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

    def _drop_expired(self) -> None:
        now = self._clock()
        for stale in [n for n, at in self._expiry.items() if at <= now]:
            self._values.pop(stale, None)
            del self._expiry[stale]

    async def get(self, names: Sequence[str]) -> list[float | None]:
        self._drop_expired()
        return [self._values.get(name) for name in names]

    async def seed(self, name: str, value: float, ttl_seconds: int) -> None:
        async with self._lock:
            self._drop_expired()
            if name not in self._values:
                self._values[name] = value
                self._expiry[name] = self._clock() + ttl_seconds

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
    def __init__(self, url: str | aioredis.Redis, prefix: str = "gw:spend:") -> None:
        self._owned = isinstance(url, str)  # a client passed in is closed by whoever made it
        self._redis = plain_client(url) if isinstance(url, str) else url
        self._prefix = prefix
        self._add = self._redis.register_script(_ADD_EXISTING)

    async def get(self, names: Sequence[str]) -> list[float | None]:
        values = await self._redis.mget([self._prefix + name for name in names])
        return [float(v) if v is not None else None for v in values]

    async def seed(self, name: str, value: float, ttl_seconds: int) -> None:
        await self._redis.set(self._prefix + name, repr(float(value)), nx=True, ex=ttl_seconds)

    async def add(self, names: Sequence[str], amount: float) -> None:
        await self._add(keys=[self._prefix + name for name in names], args=[repr(float(amount))])

    async def delete(self, names: Sequence[str]) -> None:
        await self._redis.delete(*[self._prefix + name for name in names])

    async def close(self) -> None:
        if self._owned:
            await self._redis.aclose()


LOCAL_TTL_SECONDS = 60  # while Redis is down, a process re-reads the recorded spend this often


class FallbackSpendCounters:
    """Redis's counters while it answers, else the process's (see the module's docstring); given
    `refuse`, reading them while Redis is down raises its error instead (a cost is always counted)."""

    def __init__(self, link: RedisLink, prefix: str = "gw:spend:", refuse: Refusal | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.link = link
        self.shared = RedisSpendCounters(link.client, prefix)
        self.local = MemorySpendCounters(clock)
        self.marked: set[str] = set()  # counters in Redis short of a cost this process could not add
        self._clock = clock
        self._refuse = refuse
        link.on_return(self._reconcile)

    async def get(self, names: Sequence[str]) -> list[float | None]:
        return await self.link.shared_or_local(lambda: self.shared.get(names), lambda: self.local.get(names),
                                               self._refuse)

    async def seed(self, name: str, value: float, ttl_seconds: int) -> None:
        await self.link.shared_or_local(lambda: self.shared.seed(name, value, ttl_seconds),
                                        lambda: self.local.seed(name, value, min(ttl_seconds, LOCAL_TTL_SECONDS)),
                                        self._refuse)

    async def add(self, names: Sequence[str], amount: float) -> None:
        async def locally() -> None:
            self.marked.update(names)
            await self.local.add(names, amount)

        await self.link.shared_or_local(lambda: self.shared.add(names, amount), locally)

    async def _reconcile(self) -> None:
        """Redis answers again: the marked counters go (their next read re-seeds them from the
        database), and so do the local ones (a later outage starts again from the database)."""
        while self.marked:
            names = sorted(self.marked)
            await self.shared.delete(names)
            self.marked.difference_update(names)
        self.local = MemorySpendCounters(self._clock)

    async def close(self) -> None:
        return None  # the link is closed by its owner
