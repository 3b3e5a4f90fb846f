"""A bounded, thread-safe LRU for the assembler's caches that carry work between requests."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Mapping

# The characters of tool results one cache of result views may keep alive: the caches that carry a
# conversation's views over to its next request keep a few conversations, however large their results.
VIEWS_TEXT_BUDGET = 32 * 1024 * 1024


def views_text(views: Mapping[Any, Any]) -> int:
    """The characters of text (results and their calls' arguments) a mapping of `ArtifactView`s holds."""
    return sum(len(view.content) + len(view.arguments or "") for view in views.values())


class BoundedCache:
    """A small thread-safe LRU: what it holds is a pure function of the key, so sharing results
    between requests changes no output, only the time taken.

    At most `size` entries and, with `weigh` (an entry's weight: the characters of text it holds), at
    most `max_weight` in all: a cache of a few entries of large texts stays small whatever the texts
    (an entry heavier than the whole budget is not kept)."""

    def __init__(self, size: int, max_weight: int | None = None,
                 weigh: Callable[[Any], int] | None = None) -> None:
        self.size = size
        self.max_weight = max_weight
        self.weigh = weigh if max_weight is not None else None
        self.weight = 0
        self._items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

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
            if self.max_weight is not None and weight > self.max_weight:
                return
            self._items[key] = (value, weight)
            self.weight += weight
            while len(self._items) > self.size or (self.max_weight is not None and self.weight > self.max_weight):
                self.weight -= self._items.popitem(last=False)[1][1]

    def __len__(self) -> int:
        return len(self._items)
