"""One way to memoise a function, and one way for tests to forget everything memoised.

`memo(maxsize=N)` memoises a function by its arguments: `functools.lru_cache` underneath (so the same
keys, `f(1)` and `f(x=1)` being two entries as there, the same least-recently-used bound, C speed, and
thread-safe: threads calling at once may each compute a missing value, and the cache never breaks), with
`cache_clear` and `cache_info` as there. The bound is required: nothing memoised grows without end.
No module of `gateway/`, `policies/` or `storage/` uses `functools.lru_cache` or `functools.cache`
directly (tests/test_layers.py checks it).

Where the key is not the arguments, `policies.bounded_cache.BoundedCache` is the one bounded mapping:
a cache keyed by a digest or a node id so that it keeps no text alive (token counts of long texts, a
tool message's facts), a cache that carries a conversation's work over to its next request, a cache
bounded by the text its entries hold.

Every function memoised with `memo` and every `BoundedCache` registers here, and `reset_memos()` clears
them all. That is THE way tests reset memoised state: call `reset_memos()` (or use the `fresh_memos`
fixture of tests/conftest.py), rather than replacing module globals or calling each `cache_clear`.
A test that compares work done with warm caches against work done from nothing sets the caches aside
for the fresh run (`BoundedCache.set_aside`) and gets them back after.

Why one memo per process is safe: each memoised value is a function of its key alone, the same for
every tenant, request and thread, so sharing it changes no output, only the time taken:
- pure functions of their arguments: token counts and encodings (policies/tokens.py), a call's argument
  values and short values (policies/result_facts.py), a text's terms (policies/excerpts.py),
  `Decision.as_is` (policies/assembly_types.py), SQLite's text timestamps (storage/path_reads.py),
  parsed endpoint URLs (gateway/upstream/direct_chat.py);
- functions of their arguments and of LiteLLM's model map and provider tables, which a process loads
  once and never changes (gateway/upstream/litellm_client/: params.py `chat_by_name`, direct.py
  `_resolve_direct_route`, prices.py `_map_prices`, anthropic_fields.py `_native`);
- not pure: the dashboard's stylesheet (gateway/dashboard/pages.py `_stylesheet`) is read from the
  installed package's file once; editing that file needs a restart (or `reset_memos()`).
The `BoundedCache`s are keyed by what names their content (a sha256, a node id, which names its whole
prefix): policies/bounded_cache.py says why their sharing changes no output.
"""
from __future__ import annotations

import functools
import weakref
from typing import Callable, Protocol, TypeVar

F = TypeVar("F", bound=Callable)


class Memo(Protocol):
    """Anything `reset_memos` clears: a memoised function, a `BoundedCache`."""

    def cache_clear(self) -> None: ...


# Weak: a memo made in a test, or a BoundedCache a test makes, leaves with its last reference.
_MEMOS: "weakref.WeakSet[Memo]" = weakref.WeakSet()


def register(found: Memo) -> None:
    """Count `found` among the memos `reset_memos` clears (`memo` and `BoundedCache` do it themselves)."""
    _MEMOS.add(found)


def memo(maxsize: int) -> Callable[[F], F]:
    """The function memoised by its (hashable) arguments, at most `maxsize` of them, least recently used
    first out; registered for `reset_memos`."""
    if not isinstance(maxsize, int) or isinstance(maxsize, bool) or maxsize < 1:
        raise ValueError(f"memo needs a bound of at least 1, not {maxsize!r}")

    def memoised(function: F) -> F:
        wrapper = functools.lru_cache(maxsize=maxsize)(function)
        register(wrapper)
        return wrapper  # type: ignore[return-value]

    return memoised


def registered() -> list[Memo]:
    """Every memo `reset_memos` clears now."""
    return list(_MEMOS)


def reset_memos() -> None:
    """Clear every memoised function and every `BoundedCache` of the process: as a process that has
    memoised nothing. For tests; the gateway never needs it (see the module's docstring)."""
    for found in list(_MEMOS):
        found.cache_clear()
