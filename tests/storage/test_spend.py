"""Spend counters: a seed sets only an absent counter, a cost reaches only counters that exist."""
from __future__ import annotations

import pytest

from scripts.processes import RedisServer
from storage.redis_link import RedisLink
from storage.spend import FallbackSpendCounters, MemorySpendCounters, RedisSpendCounters


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_seed_once_then_add_to_existing_counters_only(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "redis":
        counters = RedisSpendCounters(request.getfixturevalue("redis_url"),
                                      prefix=request.getfixturevalue("redis_prefix"))
    else:
        counters = MemorySpendCounters()
    await counters.add(["tenant:acme:d20261130"], 5.0)  # nobody seeded it: its seed will hold this cost
    assert await counters.get(["tenant:acme:d20261130"]) == [None]
    await counters.seed("tenant:acme:d20261130", 1.25, 60)
    await counters.seed("tenant:acme:d20261130", 99.0, 60)  # another replica's later seed changes nothing
    await counters.add(["tenant:acme:d20261130", "key:key_x:d20261130"], 0.5)
    assert await counters.get(["tenant:acme:d20261130", "key:key_x:d20261130"]) == [pytest.approx(1.75), None]
    await counters.close()


async def test_memory_counters_drop_a_period_that_is_over() -> None:
    now = [0.0]
    counters = MemorySpendCounters(clock=lambda: now[0])
    await counters.seed("tenant:acme:d20261130", 3.0, 60)
    now[0] = 61.0
    await counters.seed("tenant:acme:d20261201", 0.0, 60)
    assert await counters.get(["tenant:acme:d20261130", "tenant:acme:d20261201"]) == [None, 0.0]


async def test_memory_counters_read_an_expired_counter_as_unset() -> None:
    now = [0.0]
    counters = MemorySpendCounters(clock=lambda: now[0])
    await counters.seed("tenant:acme:d20261130", 3.0, 60)
    now[0] = 60.0
    assert await counters.get(["tenant:acme:d20261130"]) == [None]


async def test_costs_counted_while_redis_is_away_are_not_lost(own_redis: RedisServer) -> None:
    """While Redis answers nothing, counters are the process's (seeded from the database, which the
    test plays); a cost added meanwhile marks its Redis counter, which is deleted when Redis is back,
    so the next read re-seeds it from the database, which holds that cost."""
    link = RedisLink(own_redis.url, timeout_seconds=0.3)
    counters = FallbackSpendCounters(link, prefix="t:")
    refusing = FallbackSpendCounters(link, prefix="t:", refuse=lambda down: LookupError("refused"))
    day = "tenant:acme:d20261130"
    try:
        await counters.seed(day, 1.0, 3600)
        await counters.seed("key:k:d20261130", 0.0, 3600)
        await counters.add([day, "key:k:d20261130"], 0.5)
        assert await counters.get([day]) == [1.5]
        own_redis.freeze()
        await counters.add([day], 0.25)  # the run's cost is recorded in the database: 1.75 there
        assert not link.up and counters.marked == {day}
        assert not await link.probe()  # the outage confirmed: `refuse` applies
        with pytest.raises(LookupError):
            await refusing.get([day])
        await refusing.add([day], 0.0)  # a cost is never refused
        assert await counters.get([day]) == [None]  # this process's own counter, not seeded yet
        await counters.seed(day, 1.75, 3600)  # from the database
        await counters.add([day], 0.5)
        assert await counters.get([day]) == [2.25]
        own_redis.freeze(False)
        assert await link.probe()
        assert counters.marked == set() and await link.client.get(f"t:{day}") is None
        # the next read re-seeds it; a counter no cost missed stays
        assert await counters.get([day, "key:k:d20261130"]) == [None, 0.5]
        await counters.seed(day, 2.25, 3600)
        assert await counters.get([day]) == [2.25]
    finally:
        own_redis.freeze(False)
        await link.close()
