"""gateway/ops/memory.py: freed memory handed back once enough large bodies have finished, not more often."""
from __future__ import annotations

import asyncio
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import tiktoken.registry

from gateway.ops.memory import MALLOC_ARENAS, MALLOC_TRIM, Trimmer, limit_malloc_arenas
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
    """Every encoding loaded by the end of the start (the gateway's o200k_base; cl100k_base too where
    LiteLLM counted with it in this process) is lightened."""
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path), fake)
    try:
        loaded = dict(tiktoken.registry.ENCODINGS)
        assert "o200k_base" in loaded  # the gateway's (the warm-up no longer makes LiteLLM load cl100k_base)
        assert all(found._mergeable_ranks is None for found in loaded.values())
        with running.client() as http:
            assert http.post("/v1/chat/completions", json={"model": "fake", "messages": [
                {"role": "user", "content": "hello"}]}).status_code == 200
    finally:
        server.stop()


_ARENAS_OF_EIGHT_THREADS = """
import ctypes, sys, threading
from gateway.ops.memory import limit_malloc_arenas
environ = {}
if sys.argv[1] == "limit":
    print("limit", limit_malloc_arenas(environ), environ.get("MALLOC_ARENA_MAX"))
barrier = threading.Barrier(8)
def work():
    barrier.wait()  # all eight alive at once, each with blocks malloc serves
    held = [bytearray(4096) for _ in range(200)]
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
sys.stdout.flush()
ctypes.CDLL("libc.so.6").malloc_stats()  # one "Arena N:" line per arena, on stderr
"""


def _arenas_of_eight_threads(mode: str) -> tuple[int, str]:
    environ = {key: value for key, value in os.environ.items() if key != "MALLOC_ARENA_MAX"}
    done = subprocess.run([sys.executable, "-c", _ARENAS_OF_EIGHT_THREADS, mode], capture_output=True, text=True,
                          timeout=60, env={**environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert done.returncode == 0, done.stderr
    return sum(line.startswith("Arena ") for line in done.stderr.splitlines()), done.stdout.strip()


@pytest.mark.skipif(MALLOC_TRIM is None, reason="glibc's malloc only")
def test_gateway_serve_keeps_eight_threads_to_two_malloc_arenas_and_tells_its_workers() -> None:
    unlimited, _ = _arenas_of_eight_threads("none")
    limited, said = _arenas_of_eight_threads("limit")
    assert unlimited > MALLOC_ARENAS  # glibc's default: an arena for each new thread, up to 8 a core
    assert limited == MALLOC_ARENAS and said == f"limit {MALLOC_ARENAS} {MALLOC_ARENAS}"


def test_an_operators_own_malloc_arena_max_is_left_to_glibc() -> None:
    environ = {"MALLOC_ARENA_MAX": "4"}
    assert limit_malloc_arenas(environ) is None and environ == {"MALLOC_ARENA_MAX": "4"}
