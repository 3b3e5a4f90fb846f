"""Messages a format has checked before.

An agent resends its whole transcript on every turn: a 1,000-message request holds 998 messages the
gateway checked on the previous one. A message's checks look at that message alone, so a message
that passed them once passes them again; each is known by a digest of its exact JSON text (orjson
writes `1`, `1.0` and `true` apart), and only the others are checked. The same digests name the
messages to the node-id cache (policies/canonical.py), which would otherwise compute them again.

What is remembered is only that a text passed: nothing of any tenant's content is kept or served.
"""
from __future__ import annotations

import threading
from typing import Any, Sequence

from policies.canonical import exact_digest, trim_oldest

MIN_MESSAGES = 16  # shorter transcripts are checked whole: the digests would cost what they save


def message_digests(messages: Sequence[Any]) -> list[bytes | None]:
    """Each message's `exact_digest` (the node-id cache's key)."""
    return [exact_digest(message) for message in messages]


class SeenMessages:
    """Digests of messages that passed one format's checks; at most `limit`, the oldest quarter dropped
    past that."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._passed: dict[bytes, None] = {}
        self._adding = threading.Lock()

    def unseen(self, digests: Sequence[bytes | None]) -> list[int]:
        """Indices of the messages not known to pass."""
        passed = self._passed
        return [index for index, digest in enumerate(digests) if digest is None or digest not in passed]

    def passed(self, digests: Sequence[bytes | None], indices: Sequence[int]) -> None:
        with self._adding:
            for index in indices:
                digest = digests[index]
                if digest is not None:
                    self._passed[digest] = None
            trim_oldest(self._passed, self.limit)

    def __len__(self) -> int:
        return len(self._passed)
