"""gateway/ops/memory.py: freed memory handed back once enough large bodies have finished, not more often."""
from __future__ import annotations

import asyncio
import platform
from pathlib import Path

import pytest
import tiktoken.registry

from gateway.ops.memory import MALLOC_TRIM, Trimmer
from testkit.fake_upstream import FakeUpstream
from testkit.gateway import settings_for, start_gateway


def test_a_trim_follows_large_bodies_once_they_add_up_and_only_once_per_delay() -> None:
    calls: list[int] = []
    trimmer = Trimmer(threshold=1000, delay=0.05, trim=lambda: calls.append(1), quiet=60)

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


def test_a_quiet_spell_after_small_bodies_trims_once() -> None:
    calls: list[int] = []
    trimmer = Trimmer(threshold=10**9, delay=0.01, trim=lambda: calls.append(1), quiet=0.2)

    async def scenario() -> None:
        for _ in range(6):  # a load of small bodies: never quiet for 0.2 s, so no trim yet
            trimmer.finished(100)
            await asyncio.sleep(0.1)
        assert calls == [] and trimmer.pending == 600
        await asyncio.sleep(0.4)  # quiet since the last body
        assert calls == [1] and trimmer.pending == 0
        await asyncio.sleep(0.4)  # nothing new ended: no second trim
        assert calls == [1]
        trimmer.finished(100)
        await asyncio.sleep(0.4)
        assert calls == [1, 1] and trimmer.trims == 2

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


def test_after_the_start_no_loaded_encoding_keeps_its_python_ranks(fake: FakeUpstream, sqlite_url: str,
                                                                   tmp_path: Path) -> None:
    """The warm-up makes LiteLLM load cl100k_base for its counts; the start lightens it as the gateway's own."""
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path), fake)
    try:
        loaded = dict(tiktoken.registry.ENCODINGS)
        assert {"o200k_base", "cl100k_base"} <= set(loaded)  # the gateway's, and LiteLLM's since the warm-up
        assert all(found._mergeable_ranks is None for found in loaded.values())
        with running.client() as http:
            assert http.post("/v1/chat/completions", json={"model": "fake", "messages": [
                {"role": "user", "content": "hello"}]}).status_code == 200
    finally:
        server.stop()
