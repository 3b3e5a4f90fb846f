"""One Redis client for the process, whether Redis answers, and what callers do while it does not.

Every call goes through `call`, bounded by a short timeout (no retries): a dead or unreachable Redis
costs the request that finds out at most that, once. A call that fails marks Redis down and pings it;
while it is down, calls fail at once with `RedisDown` and `watch` pings Redis every `probe_seconds`. When a ping
answers, the `on_return` hooks run against Redis (before any request uses it again), then Redis is
marked up. `on_change(up, reason)` hears of an outage once a ping confirms it, and of its end (the
gateway logs and counts them); a call that failed while pings answer costs only a local count.

`shared_or_local` is what the rate limiter and the spend counters do with a call: Redis's answer,
else the process's own (storage/ratelimit.py, storage/spend.py), or, once a ping has confirmed the
outage, the error `refuse` makes.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, Awaitable, Callable, TypeVar
from urllib.parse import urlsplit, urlunsplit

# The redis package is imported by the first link made: a gateway without Redis (the embedded default)
# does not hold it (15 MB of resident memory, measured after LiteLLM's import).

T = TypeVar("T")
_FAILURES: tuple[type[BaseException], ...] = (OSError, asyncio.TimeoutError)  # RedisError joins it (`_client`)


class RedisDown(Exception):
    """Redis did not answer (in time), or is known to be down; the message says why."""


Refusal = Callable[[RedisDown], Exception]  # the error to raise instead of counting locally


def safe_url(url: str) -> str:
    """`url` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def reason(exc: BaseException) -> str:
    """`exc` in one line: the system's words for a socket's error under it ("Connection refused"),
    else its message, else its type."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return os.strerror(seen.errno)
        seen = seen.__cause__ or seen.__context__
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def plain_client(url: str) -> Any:
    """A redis-py asyncio client of `url` with its defaults (the counters' own), the package imported here."""
    import redis.asyncio as aioredis

    return aioredis.from_url(url)


def _client(url: str, timeout: float) -> Any:
    """A redis-py asyncio client of `url` with the link's timeouts; the package imported here, and its
    errors counted among the link's failures (OSError: a refused or reset socket)."""
    global _FAILURES
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError, RedisError

    _FAILURES = (RedisError, OSError, asyncio.TimeoutError)
    return aioredis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                             retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)))


class RedisLink:
    def __init__(self, url: str, *, timeout_seconds: float = 0.5, probe_seconds: float = 1.0,
                 on_change: Callable[[bool, str | None], None] | None = None) -> None:
        self.url = url
        self.timeout = timeout_seconds
        # A ping waits longer than a call: it decides whether Redis is down, and a busy event loop
        # can make a call that Redis answered look late.
        self.probe_timeout = max(2 * timeout_seconds, 1.0)
        self.probe_seconds = probe_seconds
        # One more try on a fresh connection when a pooled one turns out closed (Redis restarted
        # since it was last used); none after a timeout, which may have been applied.
        self.client = _client(url, self.probe_timeout)
        self.up = True
        self.reason: str | None = None  # why it is down
        self._said_down = False  # a ping confirmed the outage, and `on_change` heard of it
        self._on_change = on_change
        self._returns: list[Callable[[], Awaitable[None]]] = []
        self._probing = asyncio.Lock()
        self._checking: asyncio.Task[bool] | None = None  # the ping a failed call asked for

    def on_return(self, hook: Callable[[], Awaitable[None]]) -> None:
        """`hook` runs against Redis each time it answers again, before it is marked up."""
        self._returns.append(hook)

    async def call(self, operation: Callable[[], Awaitable[T]]) -> T:
        """`operation`'s result, or `RedisDown` (at once while Redis is down). A call that fails marks
        Redis down at once and asks for a ping, which says whether it was (`on_change`) or answers and
        marks it up again (a call that was only late ends up costing a few local counts)."""
        if not self.up:
            raise RedisDown(self.reason or "down")
        try:
            return await asyncio.wait_for(operation(), self.timeout)
        except _FAILURES as exc:
            self.up, self.reason = False, self._why(exc, self.timeout)
            if self._checking is None or self._checking.done():
                self._checking = asyncio.get_running_loop().create_task(self.probe())
            raise RedisDown(self.reason) from exc

    async def shared_or_local(self, shared: Callable[[], Awaitable[T]], local: Callable[[], Awaitable[T]],
                              refuse: Refusal | None = None) -> T:
        """`shared()` through Redis; while Redis is down, `local()`, or `refuse`'s error when given and a
        ping has confirmed the outage (a late call, or one failing before the ping, counts locally)."""
        try:
            return await self.call(shared)
        except RedisDown as down:
            if refuse is not None and self._said_down:
                raise refuse(down) from down
            return await local()

    async def probe(self) -> bool:
        """Ping Redis (after an outage, then run the return hooks); whether it is up."""
        async with self._probing:
            try:
                if not self.up:  # idle connections were made to the Redis that went away
                    await self.client.connection_pool.disconnect(inuse_connections=False)
                await asyncio.wait_for(self.client.ping(), self.probe_timeout)
                if not self.up:
                    for hook in self._returns:
                        await asyncio.wait_for(hook(), self.probe_timeout)
            except _FAILURES as exc:
                self.up, self.reason = False, self._why(exc, self.probe_timeout)
                self._say(False)
                return False
            self.up, self.reason = True, None
            self._say(True)
            return True

    async def watch(self) -> None:
        """Ping a Redis that is down every `probe_seconds`, until cancelled."""
        while True:
            await asyncio.sleep(self.probe_seconds)
            if not self.up:
                await self.probe()

    @staticmethod
    def _why(exc: BaseException, timeout: float) -> str:
        return f"no answer within {timeout:g} s" if isinstance(exc, asyncio.TimeoutError) else reason(exc)

    def _say(self, up: bool) -> None:
        """Tell `on_change` of an outage a ping confirmed, and of its end (not of a call that failed
        once while Redis answers pings: it only costs those calls a local count)."""
        if up != self._said_down:  # said already (or nothing to say)
            return
        self._said_down = not up
        if self._on_change is not None:
            self._on_change(up, self.reason)

    async def close(self) -> None:
        if self._checking is not None:
            self._checking.cancel()
        await self.client.aclose()
