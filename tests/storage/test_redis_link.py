"""The Redis link: a failed call marks Redis down once, calls then fail at once (or go local), a ping
that answers runs the return hooks and marks it up. Against a redis-server of the test's own."""
from __future__ import annotations

import pytest

from scripts.processes import RedisServer
from storage.redis_link import RedisDown, RedisLink, safe_url


async def test_down_once_local_meanwhile_and_back_after_a_probe(own_redis: RedisServer) -> None:
    changes: list[tuple[bool, str | None]] = []
    link = RedisLink(own_redis.url, timeout_seconds=0.5, on_change=lambda up, why: changes.append((up, why)))
    returns: list[bool] = []

    async def hook() -> None:
        returns.append(link.up)  # runs before the link is marked up
        await link.client.set("back", "1")

    link.on_return(hook)
    try:
        assert await link.probe() and await link.call(lambda: link.client.incr("n")) == 1
        own_redis.kill()
        with pytest.raises(RedisDown):  # "Connection closed by server."
            await link.call(lambda: link.client.incr("n"))
        with pytest.raises(RedisDown):  # known down: not tried again
            await link.call(lambda: link.client.incr("n"))
        assert await link.shared_or_local(lambda: link.client.incr("n"), _local) == "local"
        assert not await link.probe() and returns == []
        assert [up for up, _ in changes] == [False]  # said once, however many calls failed
        with pytest.raises(LookupError, match="refused here"):  # once a ping confirmed the outage
            await link.shared_or_local(lambda: link.client.incr("n"), _local,
                                       refuse=lambda down: LookupError(f"refused here: {down}"))
        own_redis.start()
        assert await link.probe()
        assert returns == [False] and await link.client.get("back") == b"1"
        assert [up for up, _ in changes] == [False, True] and changes[1][1] is None
        assert await link.call(lambda: link.client.incr("n")) == 1  # a fresh server, reached again
    finally:
        await link.close()


async def _local() -> str:
    return "local"


async def test_a_redis_that_answers_nothing_is_down_after_the_timeout(own_redis: RedisServer) -> None:
    link = RedisLink(own_redis.url, timeout_seconds=0.3)
    try:
        assert await link.call(lambda: link.client.set("n", 1))
        own_redis.freeze()
        with pytest.raises(RedisDown):
            await link.call(lambda: link.client.incr("n"))
        assert not link.up and link.reason
        own_redis.freeze(False)
        assert await link.probe() and await link.call(lambda: link.client.get("n")) in (b"1", b"2")
    finally:
        own_redis.freeze(False)
        await link.close()


async def test_a_call_that_fails_while_pings_answer_is_no_outage(own_redis: RedisServer) -> None:
    """A call that failed (here: an error reply; under load, a late answer) is counted locally until
    the next ping, which answers: nobody is told of an outage, and nothing is refused."""
    changes: list[tuple[bool, str | None]] = []
    link = RedisLink(own_redis.url, on_change=lambda up, why: changes.append((up, why)))
    try:
        with pytest.raises(RedisDown, match="unknown command"):
            await link.call(lambda: link.client.execute_command("NO-SUCH-COMMAND"))
        assert not link.up
        assert await link.shared_or_local(lambda: link.client.incr("n"), _local, refuse=LookupError) == "local"
        assert await link.probe() and link.up and changes == []
    finally:
        await link.close()


def test_safe_url_hides_the_password() -> None:
    assert safe_url("redis://:s3cret@cache:6380/1") == "redis://:***@cache:6380/1"
    assert safe_url("redis://user:s3cret@cache/0") == "redis://user:***@cache/0"
    assert safe_url("redis://cache:6379/0") == "redis://cache:6379/0"


def test_a_gateway_without_redis_does_not_load_the_redis_package() -> None:
    """The embedded default never talks to Redis, and the package costs 15 MB of resident memory:
    it is imported by the first Redis-backed link or counter only."""
    import subprocess
    import sys

    code = ("import sys, gateway.app, gateway.cli, storage.ratelimit, storage.spend, storage.redis_link\n"
            "print('redis' in sys.modules)")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.strip() == "False"
