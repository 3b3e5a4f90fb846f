"""`off_loop` (gateway/threads.py): what the request path relies on from a worker-thread hand-off; and
the collector's threshold while the app serves (gateway/app.py)."""
from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import time
from pathlib import Path

import pytest

from gateway import threads
from gateway.app import GC_YOUNG_OBJECTS, create_app
from gateway.threads import aside, off_loop
from testkit.gateway import settings_for
from testkit.fake_upstream import FakeUpstream

REQUEST = contextvars.ContextVar("request", default=None)


async def test_the_call_runs_on_a_worker_thread_and_returns_its_value() -> None:
    loop_thread = threading.get_ident()
    value, thread = await off_loop(lambda a, b: (a + b, threading.get_ident()), 2, 3)
    assert value == 5 and thread != loop_thread


async def test_the_call_sees_the_callers_context_and_cannot_change_it() -> None:
    REQUEST.set("req_1")

    def inside() -> str | None:
        seen = REQUEST.get()
        REQUEST.set("changed in the thread")
        return seen

    assert await off_loop(inside) == "req_1"
    assert REQUEST.get() == "req_1"


async def test_its_exception_reaches_the_caller() -> None:
    def fails() -> None:
        raise KeyError("stored nothing")

    with pytest.raises(KeyError, match="stored nothing"):
        await off_loop(fails)


async def test_a_cancelled_caller_waits_for_the_running_call_to_finish() -> None:
    started, finished = threading.Event(), threading.Event()

    def write() -> None:
        started.set()
        time.sleep(0.3)
        finished.set()

    task = asyncio.create_task(off_loop(write))
    while not started.is_set():
        await asyncio.sleep(0.005)
    task.cancel()
    await asyncio.sleep(0.05)
    task.cancel()  # a second cancellation does not let it go either
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished.is_set()  # the cancellation went on only once the write was done


async def test_a_call_cancelled_before_it_starts_never_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1)
    monkeypatch.setattr(threads, "_REQUESTS", pool)
    release, ran = threading.Event(), []
    blocker = asyncio.create_task(off_loop(release.wait))
    await asyncio.sleep(0.05)
    queued = asyncio.create_task(off_loop(ran.append, "ran"))
    await asyncio.sleep(0.05)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    release.set()
    await blocker
    pool.shutdown(wait=True)
    assert ran == []


async def test_at_most_request_threads_calls_run_at_once() -> None:
    running, most = 0, 0
    lock = threading.Lock()

    def busy() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with lock:
            running -= 1

    await asyncio.gather(*(off_loop(busy) for _ in range(threads.REQUEST_THREADS * 2)))
    assert 1 < most <= threads.REQUEST_THREADS


async def test_the_apis_pool_answers_while_every_request_thread_is_busy() -> None:
    """A read of the records API, a health check or housekeeping (`aside`) does not queue behind the
    model requests' calls (`off_loop`), nor they behind it."""
    release = threading.Event()
    busy = [asyncio.create_task(off_loop(release.wait)) for _ in range(threads.REQUEST_THREADS + 2)]
    try:
        assert await asyncio.wait_for(aside(lambda: "answered"), timeout=5) == "answered"
        assert not any(task.done() for task in busy)
    finally:
        release.set()
        await asyncio.gather(*busy)


async def test_serving_raises_the_collectors_first_threshold_and_the_last_app_to_stop_restores_it(
        fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> None:
    before = gc.get_threshold()  # raised already if another test's gateway still serves
    first = create_app(settings_for(fake.api_base, sqlite_url, tmp_path / "first"))
    second = create_app(settings_for(fake.api_base, f"sqlite:///{tmp_path / 'second.db'}", tmp_path / "second"))
    serving_first, serving_second = first.router.lifespan_context(first), second.router.lifespan_context(second)
    await serving_first.__aenter__()
    assert gc.get_threshold() == (GC_YOUNG_OBJECTS, 20, 20)
    await serving_second.__aenter__()
    await serving_first.__aexit__(None, None, None)
    assert gc.get_threshold() == (GC_YOUNG_OBJECTS, 20, 20)  # the second one still serves
    await serving_second.__aexit__(None, None, None)
    assert gc.get_threshold() == before
    assert GC_YOUNG_OBJECTS > 700  # Python's default first threshold
