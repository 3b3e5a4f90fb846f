"""Giving the memory that large request bodies used back to the system.

A large body is read, parsed, hashed, captured and projected: several times its size in objects, most
of them freed when the request ends. glibc's malloc keeps freed memory for the process's next
allocations instead of returning it (large blocks too, once its mmap threshold has risen past their
size), so after a burst of large bodies the RSS stays near the burst's peak for good. `malloc_trim(0)`
hands the free pages of every arena back. `Trimmer` calls it on the aside thread pool, a second after
requests whose bodies add up to `threshold` bytes have finished (and no more often than that), and
once the gateway has been quiet for `quiet` seconds after any body it has not trimmed after yet: what
a load of small bodies left free is handed back when the load ends, not only after the next 16 MB.

Measured with bench/large_bodies.py (50 concurrent clients, 3 MB transcripts, two rounds; RSS before,
at the peak, 20 s after): with the caches bounded by text (policies/bounded_cache.py) 392, 970, 875 MB
without a trim and 391, 918, 517 MB with it; main before both: 396, 1,202, 1,136 MB.

glibc also gives each new thread an arena of its own, up to 8 per core, and each keeps pages that a
few live objects pin after its thread freed the rest: `limit_malloc_arenas` caps them at
`MALLOC_ARENAS` for `gateway serve` and its workers (bench/memory_growth.py --windows 2 --seconds 15:
RSS after each window 410 and 413 MB with glibc's default, 398 and 402 MB with two arenas).
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
import os
from typing import Callable, MutableMapping

from gateway.threads import aside

log = logging.getLogger("gateway")

TRIM_THRESHOLD_BYTES = 16 * 1024 * 1024
TRIM_DELAY_SECONDS = 1.0
QUIET_SECONDS = 2.0


def _glibc_trim() -> Callable[[], object] | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, macOS): nothing to trim this way
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


MALLOC_TRIM = _glibc_trim()

ARENA_ENV = "MALLOC_ARENA_MAX"  # read by glibc when a process starts
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # mallopt's parameter for it (glibc's malloc.h)


def limit_malloc_arenas(environ: MutableMapping[str, str] = os.environ, arenas: int = MALLOC_ARENAS) -> int | None:
    """At most `arenas` malloc arenas for the threads this process starts from now on, and for the
    processes it starts (worker processes' glibc reads `MALLOC_ARENA_MAX` from `environ`). An
    operator's own `MALLOC_ARENA_MAX` is left to glibc, which applied it when this process started.
    Returns the limit set here, or None: the operator's stands, or this is not glibc."""
    if environ.get(ARENA_ENV):
        return None
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(_M_ARENA_MAX, arenas) != 1:  # 1 is success
        return None
    environ[ARENA_ENV] = str(arenas)
    return arenas


class Trimmer:
    def __init__(self, threshold: int = TRIM_THRESHOLD_BYTES, delay: float = TRIM_DELAY_SECONDS,
                 trim: Callable[[], object] | None = MALLOC_TRIM, quiet: float = QUIET_SECONDS) -> None:
        self.threshold = threshold
        self.delay = delay
        self.quiet = quiet
        self.trim = trim
        self.pending = 0  # body bytes of requests finished since the last trim
        self.trims = 0
        self._scheduled = False
        self._watching = False  # a quiet check is due
        self._last_finished = 0.0

    def finished(self, body_bytes: int) -> None:
        """A request whose body was `body_bytes` long has ended (called on the event loop)."""
        if self.trim is None or not body_bytes:
            return
        loop = asyncio.get_running_loop()
        self.pending += body_bytes
        self._last_finished = loop.time()
        if self.pending >= self.threshold and not self._scheduled:
            self._scheduled = True
            loop.call_later(self.delay, self._start)
        elif not self._watching:
            self._watching = True
            loop.call_later(self.quiet, self._when_quiet)

    def _when_quiet(self) -> None:
        """A trim once no request has ended for `quiet` seconds, if any ended since the last one."""
        loop = asyncio.get_running_loop()
        waited = loop.time() - self._last_finished
        if waited < self.quiet:
            loop.call_later(self.quiet - waited, self._when_quiet)
            return
        self._watching = False
        if self.pending and not self._scheduled:
            self._scheduled = True
            self._start()

    def _start(self) -> None:
        asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        self.pending = 0
        try:
            assert self.trim is not None
            await aside(self.trim)
            self.trims += 1
        except Exception:  # never worth failing anything for
            log.debug("malloc_trim failed", exc_info=True)
        finally:
            self._scheduled = False
