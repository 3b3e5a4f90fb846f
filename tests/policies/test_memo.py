"""policies/memo.py: a bounded memo with lru_cache's keys, registered so that `reset_memos` clears it
(and every BoundedCache) at once."""
from __future__ import annotations

import threading
import time

import pytest

from policies.bounded_cache import BoundedCache
from policies.memo import memo, registered, reset_memos


def test_the_least_recently_used_argument_goes_first() -> None:
    calls = []

    @memo(maxsize=2)
    def double(x: int) -> int:
        calls.append(x)
        return 2 * x

    assert [double(1), double(2), double(1), double(3)] == [2, 4, 2, 6]  # 3 pushes out 2, not 1
    assert (double(1), double(2)) == (2, 4)
    assert calls == [1, 2, 3, 2]
    info = double.cache_info()
    assert (info.maxsize, info.currsize, info.hits, info.misses) == (2, 2, 2, 4)
    double.cache_clear()
    assert double(1) == 2 and calls[-1] == 1


def test_keys_are_lru_caches_own() -> None:
    """Positional and keyword arguments as given: `f(1)` and `f(x=1)` are two entries, as with
    functools.lru_cache; keyword order counts too; equal arguments share one."""
    calls = []

    @memo(maxsize=16)
    def join(x: int, y: str = "a", *, z: tuple = ()) -> str:
        calls.append((x, y, z))
        return f"{x}{y}{z}"

    assert join(1) == join(1) == "1a()" and len(calls) == 1
    assert join(x=1) == "1a()" and len(calls) == 2
    assert join(1, y="b", z=(1,)) == join(1, y="b", z=(1,)) and len(calls) == 3
    assert join(1, z=(1,), y="b") == "1b(1,)" and len(calls) == 4
    with pytest.raises(TypeError):
        join([1])  # type: ignore[arg-type]  # unhashable, as with lru_cache


def test_a_bound_is_required() -> None:
    for bad in (None, 0, -1, True, 1.5):
        with pytest.raises(ValueError):
            memo(maxsize=bad)  # type: ignore[arg-type]


def test_reset_memos_clears_every_memo_and_bounded_cache() -> None:
    calls = []

    @memo(maxsize=4)
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    cache = BoundedCache(4)
    assert square in registered() and cache in registered()
    square(3)
    cache.put("k", 1)
    reset_memos()
    assert cache.get("k") is None and len(cache) == 0 and cache.weight == 0
    assert square.cache_info().currsize == 0 and square(3) == 9 and calls == [3, 3]


def test_registered_memos_leave_with_their_last_reference() -> None:
    before = len(registered())

    @memo(maxsize=1)
    def one() -> int:
        return 1

    assert len(registered()) == before + 1
    del one
    assert len(registered()) == before


def test_threads_share_one_bounded_memo() -> None:
    """Several threads calling at once get the right values, and the memo stays within its bound."""
    calls = []

    @memo(maxsize=64)
    def slow(x: int) -> int:
        calls.append(x)
        time.sleep(0.0005)
        return x * 3

    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def work(offset: int) -> None:
        try:
            start.wait()
            for i in range(400):
                x = (i * 7 + offset) % 100
                assert slow(x) == 3 * x
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    info = slow.cache_info()
    assert info.currsize <= 64 and info.hits + info.misses == 6 * 400 and len(calls) == info.misses


def test_set_aside_empties_a_bounded_cache_for_a_while() -> None:
    cache = BoundedCache(4, max_weight=100, weigh=len)
    cache.put("a", "xx")
    with cache.set_aside():
        assert cache.get("a") is None and cache.weight == 0
        cache.put("b", "yyy")
    assert (cache.get("a"), cache.get("b"), cache.weight) == ("xx", None, 2)
