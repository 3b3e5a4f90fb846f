"""gateway/ops/memory.py: freed memory handed back once enough large bodies have finished, not more often."""
from __future__ import annotations

import asyncio
import platform

import pytest

from gateway.ops.memory import MALLOC_TRIM, Trimmer


def test_a_trim_follows_large_bodies_once_they_add_up_and_only_once_per_delay() -> None:
    calls: list[int] = []
    trimmer = Trimmer(threshold=1000, delay=0.05, trim=lambda: calls.append(1))

    async def scenario() -> None:
        trimmer.finished(600)
        await asyncio.sleep(0.1)
        assert calls == []  # 600 < 1000: not yet
        trimmer.finished(600)
        trimmer.finished(5000)  # one trim is already due: no second one
        assert calls == []  # a delay after the request ends, never on the request's own time
        await asyncio.sleep(0.2)
        assert calls == [1] and trimmer.pending == 0 and trimmer.trims == 1
        trimmer.finished(1000)
        await asyncio.sleep(0.2)
        assert calls == [1, 1]

    asyncio.run(scenario())


def test_without_malloc_trim_nothing_is_scheduled() -> None:
    trimmer = Trimmer(threshold=1, delay=0.01, trim=None)

    async def scenario() -> None:
        trimmer.finished(10)
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert trimmer.trims == 0


def test_glibc_trim_runs_here() -> None:
    """On glibc the real call is made and answers."""
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    assert MALLOC_TRIM is not None
    assert MALLOC_TRIM() in (0, 1)
