"""Transcript identity at C speed: the canonical form and node ids of policies/transcript.py, and the
digests the gateway's caches of messages are keyed by; `canonical_json` (and the SDK's compact JSON)
written by orjson wherever they agree.

orjson writes sorted keys, no spaces and unicode as is, escaping exactly what
`json.dumps(..., ensure_ascii=False)` escapes, with the same code-point key order
(UTF-8 keeps it). Two things differ: floats (orjson writes `1e-7` where Python
writes `1e-07`) and integers past 64 bits (orjson refuses them). A value holding
either goes to `canonical_json` itself, so node ids never depend on which ran.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import threading
from typing import Any, Mapping, Sequence

import orjson

from policies.bounded_cache import BoundedCache
from policies.transcript import PathNode, canonical_json, message_path, node_id

_RESUME_LOOKBACK = 4  # an agent's request resends the one before with a round or two more
_MAX_DEPTH = 64  # deeper than any message a client sends: `canonical_json` decides


def _plain(value: Any, depth: int = 0) -> bool:
    """No floats and no integers past 64 bits anywhere in `value` (bool is an int: fine)."""
    if isinstance(value, str) or value is None or value is True or value is False:
        return True
    if isinstance(value, int):
        return -(2 ** 63) <= value < 2 ** 63
    if depth >= _MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v, depth + 1) for v in value)
    return False


def fast_canonical_json(value: Any) -> str:
    """Exactly `canonical_json(value)`."""
    if not _plain(value):
        return canonical_json(value)
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # lone surrogates, which orjson refuses (JSONEncodeError is a TypeError)
        return canonical_json(value)


def compact_json(value: Any, *, finite: bool = False) -> str:
    """Exactly `json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)`: keys in
    their order, as the openai SDK serialises a request body.

    `finite`: the caller knows `value` holds no NaN or infinity (it was read from JSON, which has
    neither), so no walk looks for them first: orjson writes, and its text is kept unless it may hold a
    float orjson writes differently (`_orjson_may_differ`), found in the text itself. A request body of
    1,000 messages is serialised in about a fifth of the time the walk alone takes.
    """
    if finite:
        text = orjson_text(value)
        if text is not None:
            return text.decode()
    elif _plain(value):
        try:
            return orjson.dumps(value).decode()
        except TypeError:
            pass
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def compact_json_bytes(value: Any) -> bytes:
    """`compact_json(value, finite=True)` encoded as UTF-8, without decoding orjson's bytes and encoding
    them again (a request body is serialised so on every call)."""
    text = orjson_text(value)
    if text is not None:
        return text
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def orjson_text(value: Any) -> bytes | None:
    """orjson's text of a value holding no NaN or infinity, where it is Python's; None elsewhere."""
    try:
        text = orjson.dumps(value)
    except TypeError:  # lone surrogates, integers past 64 bits, types orjson does not know
        return None
    return None if _orjson_may_differ(text) else text


_DIGITS = frozenset(b"0123456789")


def _orjson_may_differ(text: bytes) -> bool:
    """Whether orjson's `text` may write a float otherwise than Python: Python writes every float under
    1e-4 with an exponent of at least two digits (`1e-07`, `4.67e-05`), where orjson writes a one-digit
    exponent (`1e-7`) or none (`0.0000467`); every other float and every integer both write alike
    (checked on a million random floats). A string that merely looks like one of these only costs the
    slow path. (`bytes.find` skips to each `e-`; a regular expression starting at a digit tries every
    position and took four times as long on a 92 KB body.)"""
    if b"0.0000" in text:
        return True
    at = text.find(b"e-")
    while at != -1:
        end = at + 3
        if at > 0 and text[at - 1] in _DIGITS and end <= len(text) and text[at + 2] in _DIGITS \
                and (end == len(text) or text[end] not in _DIGITS):
            return True
        at = text.find(b"e-", at + 2)
    return False


def trim_oldest(items: dict[Any, Any], limit: int) -> None:
    """Past `limit` entries, the oldest quarter of `items` (in insertion order) goes: a bounded memo
    read without a lock on the hot path, trimmed under its writer's lock."""
    if len(items) > limit:
        for old in list(itertools.islice(items, len(items) // 4)):
            del items[old]


def exact_digest(message: Any) -> bytes | None:
    """A digest of `message`'s exact JSON text (orjson writes `1`, `1.0` and `true` apart), or None
    where orjson cannot write it (lone surrogates, integers past 64 bits). SHA-256 cut to 16 bytes: with
    the CPU's SHA instructions it is about twice as fast as BLAKE2b here, and nothing stores it."""
    try:
        return text_digest(orjson.dumps(message))
    except TypeError:
        return None


def text_digest(text: bytes) -> bytes:
    """`exact_digest` of a value whose orjson text is `text`."""
    return hashlib.sha256(text).digest()[:16]


class NodeIds:
    """`node_id(tenant, parent, message, fast_canonical_json)`, remembered by a digest of the message's exact
    JSON: an agent resends its whole transcript every turn, and a message seen before is placed again
    without being canonicalised again.

    The key is exact: orjson writes `1`, `1.0` and `true` apart, so two messages with the same bytes are
    the same JSON value and have the same canonical form. A message orjson refuses (lone surrogates,
    integers past 64 bits) is not remembered. At most `limit` ids are kept; past that the oldest
    quarter goes.
    """

    def __init__(self, limit: int = 50_000, paths: int = 512, path_ids: int = 50_000) -> None:
        self.limit = limit
        self._ids: dict[tuple[str, str | None, bytes], str] = {}
        self._adding = threading.Lock()
        # Recent requests' paths by (tenant, length, last message's digest): (SHA-256 of all their
        # messages' digests, their node ids). A conversation's next request resends that prefix: it is
        # placed by one comparison instead of a look-up per message (`_resumed`). At most `paths` of
        # them and `path_ids` ids in all (mostly the strings `_ids` holds; at worst ~6 MB of their own).
        self._paths = BoundedCache(paths, max_weight=path_ids, weigh=lambda found: len(found[1]))

    def __call__(self, tenant: str, parent: str | None, message: Mapping[str, Any],
                 digest: bytes | None = None) -> str:
        """`digest`: the message's, if known (gateway/wire/seen_messages.py works it out the same way)."""
        if digest is None:
            digest = exact_digest(message)
            if digest is None:
                return node_id(tenant, parent, message, fast_canonical_json)
        key = (tenant, parent, digest)
        found = self._ids.get(key)
        if found is None:
            found = node_id(tenant, parent, message, fast_canonical_json)
            with self._adding:
                self._ids[key] = found
                trim_oldest(self._ids, self.limit)
        return found

    def path(self, tenant: str, messages: Sequence[Mapping[str, Any]],
             digests: Sequence[bytes | None]) -> list[PathNode]:
        """`message_path(tenant, messages, ids=self)` with each message's digest given (`digests[i]`:
        message i's, or None). The prefix an earlier request of the conversation placed (found among the
        last `_RESUME_LOOKBACK` positions, where an agent's previous request ended) takes that request's
        ids, checked exact by the digests of all its messages; the rest is placed in one loop: a
        1,000-message request places 1,000 messages, and a call per message through `__call__` cost
        about half of it."""
        if len(digests) != len(messages):
            return message_path(tenant, messages, ids=self)
        resumed = self._resumed(tenant, digests)
        done, ids, hashed = resumed if resumed is not None else (0, [], None)
        path = list(map(tuple.__new__, itertools.repeat(PathNode),
                        zip(ids, itertools.chain((None,), ids), range(done), messages)))
        known, parent = self._ids, ids[-1] if ids else None
        learned: dict[tuple[str, str | None, bytes], str] = {}
        for position in range(done, len(messages)):
            message, digest = messages[position], digests[position]
            if digest is None:
                found = self(tenant, parent, message)
            else:
                key = (tenant, parent, digest)
                found = known.get(key)
                if found is None:
                    found = learned[key] = node_id(tenant, parent, message, fast_canonical_json)
            path.append(PathNode(found, parent, position, message))
            parent = found
        if learned:
            with self._adding:
                known.update(learned)
                trim_oldest(known, self.limit)
                for stale in list(itertools.islice(known, max(0, len(known) - self.limit))):
                    del known[stale]  # a path of more new messages than a quarter of the limit
        self._remember(tenant, digests, path, done, hashed)
        return path

    def _resumed(self, tenant: str, digests: Sequence[bytes | None]) -> tuple[int, list[str], Any] | None:
        """(length, ids, the running SHA-256 of their digests) of the longest prefix of `digests` that an
        earlier request placed whole, looked for at the last few lengths; None when there is none."""
        for length in range(len(digests), max(0, len(digests) - _RESUME_LOOKBACK), -1):
            found = self._paths.get((tenant, length, digests[length - 1]))
            if found is None:
                continue
            try:
                hashed = hashlib.sha256(b"".join(digests[:length]))  # type: ignore[arg-type]
            except TypeError:  # a digest not known: no earlier path was remembered with it
                return None
            if hashed.digest() == found[0]:
                return length, found[1], hashed
        return None

    def _remember(self, tenant: str, digests: Sequence[bytes | None], path: list[PathNode], done: int,
                  hashed: Any) -> None:
        """Keep this path for the conversation's next request (`_resumed`), when every digest is known."""
        if not path or done == len(path):
            return
        rest = digests[done:] if hashed is not None else digests
        if None in rest:
            return
        hashed = hashed if hashed is not None else hashlib.sha256()
        hashed.update(b"".join(rest))  # type: ignore[arg-type]
        self._paths.put((tenant, len(path), digests[-1]), (hashed.digest(), [node.id for node in path]))

    def __len__(self) -> int:
        return len(self._ids)
