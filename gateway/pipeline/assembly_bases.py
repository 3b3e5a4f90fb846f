"""The decisions of recent requests, so the next request on the same path stores only what changed.

Between epochs a request's decisions are the previous request's plus the new
round's; at a move, the rounds it re-renders. The gateway keeps each recorded
request's notable decisions (every one but `verbatim`) for a while in this
process; the next request on the path names that request as its base and
stores the difference (storage/assembly_record.py). A base this process does not
hold (another replica answered it, a restart, the cache moved on) means the
request stores its decisions whole, and so does every `MAX_BASE_DEPTH`-th
request of a chain, which bounds what a read walks.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Mapping

from storage.assembly_record import MAX_BASE_DEPTH, AssemblyRecord

# notable decisions, depth of the chain behind them, replacements with their digests
_Entry = tuple[Mapping[int, dict[str, Any]], int, Mapping[int, tuple[Mapping[str, Any], str]]]


# What the map may hold in all, in notable decisions and replacements (the entries of the two tables
# each request holds, besides the dicts it shares with its base: bench/memory_growth.py measured about
# 5 KB a request of 100 messages under coding-agent, some 50 bytes an entry). By count alone, 4,096
# requests of 1,000 messages (some 500 memories each, in both tables) would hold about 4 million entries.
MAX_HELD_DECISIONS = 200_000


def _weight(entry: _Entry) -> int:
    notable, _, forwarded = entry
    return len(notable) + len(forwarded) + 1


class RecentAssemblies:
    """A bounded map: request id -> the decisions it stored (as the reader restores them), and its
    replacements with their digests; at most `size` requests and `max_decisions` of their decisions and
    replacements together, the least recently remembered dropped first (a request whose base went
    stores its decisions whole)."""

    def __init__(self, size: int = 4096, max_decisions: int = MAX_HELD_DECISIONS) -> None:
        self.size, self.max_decisions = size, max_decisions
        self.held = 0  # the weight of what is held: decisions and replacements, one more per request
        self._items: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def based(self, record: AssemblyRecord, previous_request_id: str | None) -> AssemblyRecord:
        """`record` naming the previous request on its path as its base, when that request is held
        here and its chain is short enough; else as it is (stored whole). Either way it is handed the
        digests of that request's replacements, when held (`AssemblyRecord.earlier_forwarded`)."""
        with self._lock:
            found = self._items.get(previous_request_id) if previous_request_id else None
        if found is None:
            return record
        notable, depth, forwarded = found
        if depth + 1 >= MAX_BASE_DEPTH:
            return replace(record, earlier_forwarded=forwarded)
        return replace(record, base_request_id=previous_request_id, base_decisions=notable,
                       earlier_forwarded=forwarded)

    def remember(self, request_id: str, record: AssemblyRecord) -> None:
        """After `record` is stored: what a request based on it may leave out."""
        depth = 0
        if record.base_request_id is not None:
            with self._lock:
                base = self._items.get(record.base_request_id)
            depth = base[1] + 1 if base else MAX_BASE_DEPTH
        entry = (record.notable, depth, record.forwarded)
        weight = _weight(entry)
        if weight > self.max_decisions:
            return  # more than the whole budget: the next request on its path stores its decisions whole
        with self._lock:
            earlier = self._items.pop(request_id, None)
            if earlier is not None:
                self.held -= _weight(earlier)
            self._items[request_id] = entry
            self.held += weight
            while len(self._items) > self.size or self.held > self.max_decisions:
                _, dropped = self._items.popitem(last=False)
                self.held -= _weight(dropped)
