"""Keys made through the API, as this process last read them from the database.

Every replica reads the same `api_keys` table; none is told when another
creates or revokes a key. So each process remembers a lookup (found or not)
for at most `HOLD_SECONDS`: a key created on another replica works at its
first use here (a digest never seen before is read from the database), and a
key revoked on another replica is refused here within `HOLD_SECONDS` (the
replica that revokes it forgets it at once). An unknown `gw-` key costs one
query per digest per `HOLD_SECONDS`, not one per request.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from storage.api_keys import ApiKeyRecord
from storage.records import RecordStore

HOLD_SECONDS = 0.5
_MAX_ENTRIES = 10_000  # past this, expired entries are swept on the next store


class DatabaseKeys:
    def __init__(self, store: RecordStore, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._clock = clock
        self._entries: dict[str, tuple[float, ApiKeyRecord | None]] = {}
        self._lock = threading.Lock()

    def cached(self, digest: str) -> tuple[bool, ApiKeyRecord | None]:
        """(known, record): known is False when the database must be asked."""
        entry = self._entries.get(digest)
        if entry is None or entry[0] <= self._clock():
            return False, None
        return True, entry[1]

    def load(self, digest: str) -> ApiKeyRecord | None:
        """Read the key from the database (blocking) and remember the answer."""
        record = self._store.api_key_by_digest(digest)
        now = self._clock()
        with self._lock:
            if len(self._entries) >= _MAX_ENTRIES:
                for stale in [d for d, (until, _) in self._entries.items() if until <= now]:
                    del self._entries[stale]
            self._entries[digest] = (now + HOLD_SECONDS, record)
        return record

    def forget(self, digest: str) -> None:
        """A key this process created or revoked: the next use reads it again."""
        with self._lock:
            self._entries.pop(digest, None)
