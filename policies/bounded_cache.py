"""The one bounded mapping: a thread-safe LRU for caches whose key is not a function's arguments.

A function memoised by its arguments uses `policies.memo.memo`. A `BoundedCache` is for the rest: a
cache keyed by what names a value's content rather than by the content (a sha256, a node id, so that
it keeps no text alive), the caches that carry a conversation's work over to its next request, and
caches bounded by the text their entries hold. Every instance registers with policies/memo.py, so
`reset_memos()` clears it with the memoised functions; a test that needs a fresh process's caches for
a while, and its warm ones back after, uses `set_aside`.
"""
from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from typing import Any, Callable, Iterator, Mapping

from policies.memo import register

# The characters of tool results one cache of result views may keep alive: the caches that carry a
# conversation's views over to its next request keep a few conversations, however large their results.
VIEWS_TEXT_BUDGET = 32 * 1024 * 1024
# ... and one conversation's, at most: past it, its next request builds its views again (the time its
# tens of MB of results take to read and store anyway dwarfs that) rather than the cache keeping one huge
# conversation alive after it has gone quiet. A burst of 8 conversations of 30 MiB each left three such
# caches holding the last one's 31 MB of results (bench/memory_burst.py's bodies, served in one process).
VIEWS_TEXT_LARGEST = VIEWS_TEXT_BUDGET // 8


def views_cache(weigh: Callable[[Any], int]) -> "BoundedCache":
    """A cache that carries a conversation's result views to its next request: 128 entries, at most
    VIEWS_TEXT_BUDGET characters of results in all and VIEWS_TEXT_LARGEST in one entry (`weigh`)."""
    return BoundedCache(128, max_weight=VIEWS_TEXT_BUDGET, weigh=weigh, largest=VIEWS_TEXT_LARGEST)


def views_text(views: Mapping[Any, Any]) -> int:
    """The characters of text (results and their calls' arguments) a mapping of `ArtifactView`s holds."""
    return sum(map(view_text, views.values()))


def view_text(view: Any) -> int:
    """The characters of text (its result and its call's arguments) an `ArtifactView` holds."""
    return len(view.content) + len(view.arguments or "")


class BoundedCache:
    """A small thread-safe LRU: what it holds is a pure function of the key, so sharing results
    between requests changes no output, only the time taken.

    At most `size` entries and, with `weigh` (an entry's weight: the characters of text it holds), at
    most `max_weight` in all: a cache of a few entries of large texts stays small whatever the texts
    (an entry heavier than `largest`, by default the whole budget, is not kept)."""

    def __init__(self, size: int, max_weight: int | None = None,
                 weigh: Callable[[Any], int] | None = None, largest: int | None = None) -> None:
        self.size = size
        self.max_weight = max_weight
        self.largest = min(largest, max_weight) if largest is not None and max_weight is not None else max_weight
        self.weigh = weigh if max_weight is not None else None
        self.weight = 0
        self._items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        register(self)

    def get(self, key: Any) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key][0]
        return None

    def put(self, key: Any, value: Any) -> None:
        weight = self.weigh(value) if self.weigh is not None else 0
        with self._lock:
            earlier = self._items.pop(key, None)
            if earlier is not None:
                self.weight -= earlier[1]
            if self.largest is not None and weight > self.largest:
                return
            self._items[key] = (value, weight)
            self.weight += weight
            while len(self._items) > self.size or (self.max_weight is not None and self.weight > self.max_weight):
                self.weight -= self._items.popitem(last=False)[1][1]

    def __len__(self) -> int:
        return len(self._items)

    def cache_clear(self) -> None:
        """Forget every entry (`policies.memo.reset_memos` calls it)."""
        with self._lock:
            self._items = OrderedDict()
            self.weight = 0

    @contextlib.contextmanager
    def set_aside(self) -> Iterator[None]:
        """Empty inside the block, as in a process that has seen nothing; on leaving, the entries it held
        before come back and those put inside are dropped."""
        with self._lock:
            kept, kept_weight = self._items, self.weight
            self._items, self.weight = OrderedDict(), 0
        try:
            yield
        finally:
            with self._lock:
                self._items, self.weight = kept, kept_weight
