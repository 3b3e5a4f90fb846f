"""Spend counters: a seed sets only an absent counter, a cost reaches only counters that exist."""
from __future__ import annotations

import pytest

from storage.spend import MemorySpendCounters, RedisSpendCounters


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
