"""Blocking work off the event loop, on the gateway's own thread pool (issue 11).

Starlette's `run_in_threadpool` goes through anyio (a capacity limiter, cancel scopes, run-vars,
sniffio): profiled with py-spy under load at 20 clients, the five hand-offs a request made took about
a tenth of the process's samples. `off_loop` hands the call to a `ThreadPoolExecutor` through the
loop itself and keeps what the request path relies on from anyio's:

* the call sees the caller's context variables (tracing spans, the request id);
* at most `MAX_THREADS` calls run at once (anyio's default limiter holds 40), the rest queue;
* a cancelled caller does not abandon the call: the cancellation goes on once the call has
  returned, so whatever the call wrote is known to have been written (a capture, a run's outcome).
"""
from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")

MAX_THREADS = 40
_POOL = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="gateway-worker")


async def off_loop(function: Callable[..., T], /, *args: object) -> T:
    """`function(*args)` on a worker thread, in a copy of the caller's context."""
    loop = asyncio.get_running_loop()
    call: Future[T] = _POOL.submit(contextvars.copy_context().run, function, *args)
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
