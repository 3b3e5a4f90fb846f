"""Blocking work off the event loop, on the gateway's own two thread pools (issue 11).

Starlette's `run_in_threadpool` goes through anyio (a capacity limiter, cancel scopes, run-vars,
sniffio): profiled with py-spy under load at 20 clients, the five hand-offs a request made took about
a tenth of the process's samples. `off_loop` hands the call to a `ThreadPoolExecutor` through the
loop itself and keeps what the request path relies on from anyio's:

* the call sees the caller's context variables (tracing spans, the request id);
* at most `REQUEST_THREADS` calls run at once (anyio's default limiter holds 40), the rest queue;
* a cancelled caller does not abandon the call: the cancellation goes on once the call has
  returned, so whatever the call wrote is known to have been written (a capture, a run's outcome).

Two pools. The model requests' (`off_loop`) holds few threads: what runs there is mostly Python (parsing,
capture, assembly), which the GIL runs one thread at a time whatever the pool's size, so more threads
only add turns to wait. Those turns are worst for the thread that holds SQLite's write lock: it gives
the GIL up around every statement and waits for it again behind every busy thread, while every other
writer, in this process and the others on the file, waits for the lock (storage/group_commit.py).
Measured with 20 clients on bench/proxy_compare.py's synthetic sessions (coding-agent), alternating
fresh processes, 4 threads against 40 (anyio's number, and this pool's before):
- 1,000 messages, one worker: 34.7, 30.5, 34.3, 35.0 against 25.7, 26.5, 30.7, 27.8 requests/s; the
  process's CPU per request 31 to 35 ms against 35 to 42 ms;
- 1,000 messages, two workers: 33.8, 31.2, 36.7, 32.2 against 29.0, 27.4, 28.7, 36.8 requests/s; a group
  commit held the file's lock 11 to 15 ms on average against 70 to 250 ms (per run);
- 100 messages: 132.9 and 127.9 against 109.2 and 108.5 requests/s (2 threads: 139.8, 132.7; 8: 123.5,
  107.3); on PostgreSQL 93.4, 85.4, 77.9, 87.4 against 67.4, 69.4, 79.7, 76.1.
The other pool (`aside`) serves the records, keys, dashboard and admin APIs, health checks, startup and
housekeeping: a slow read or a purge there never holds up a model request's capture.
"""
from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")

REQUEST_THREADS = 4
ASIDE_THREADS = 16
_REQUESTS = ThreadPoolExecutor(max_workers=REQUEST_THREADS, thread_name_prefix="gateway-request")
_ASIDE = ThreadPoolExecutor(max_workers=ASIDE_THREADS, thread_name_prefix="gateway-aside")


async def off_loop(function: Callable[..., T], /, *args: object) -> T:
    """`function(*args)` on a thread of the model requests' pool, in a copy of the caller's context."""
    return await _on(_REQUESTS, function, args)


async def aside(function: Callable[..., T], /, *args: object) -> T:
    """`off_loop` on the pool beside the model requests' (APIs, health, startup, housekeeping)."""
    return await _on(_ASIDE, function, args)


async def _on(pool: ThreadPoolExecutor, function: Callable[..., T], args: tuple[object, ...]) -> T:
    loop = asyncio.get_running_loop()
    call: Future[T] = pool.submit(contextvars.copy_context().run, function, *args)
    try:
        return await asyncio.wrap_future(call, loop=loop)
    except asyncio.CancelledError:
        if not call.cancel():  # it is running: it finishes before the cancellation goes on
            await _finished(loop, call)
        raise


async def _finished(loop: asyncio.AbstractEventLoop, call: Future[T]) -> None:
    """Wait until `call` is done, whatever cancellations arrive meanwhile."""
    done = loop.create_future()
    call.add_done_callback(lambda _: loop.call_soon_threadsafe(_settle, done))
    while not done.done():
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            continue


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
