"""Where each message of a recent chat body ends, so that the next body of the same conversation is
known by its bytes.

An agent resends its whole transcript, a message or two longer, on every turn, and the JSON text of
the messages it sent before is byte for byte what it sent then. Every message's digest
(`policies.canonical.exact_digest`: the seen-messages and node-id caches' key) is a function of the
message's value, and a JSON text's value is a function of its bytes: where a body's first bytes, up
to the end of message k, are a recent body's, its messages 0..k are that body's and so are their
digests. Only the messages after them are serialised and hashed (2.6 ms of SHA-256 and orjson for a
1,000-message body, where comparing the bytes takes about 0.03 ms).

That holds only where the array whose elements end at those offsets is the body's top-level
`messages` (the one the parser keeps). A layout is therefore recorded only where that is shown:
- the body is exactly what orjson writes for its parse (compact, as the OpenAI and Anthropic SDKs,
  Claude Code and Codex send it), so its key order and offsets follow from the values; or
- a scan of the bytes (`_scanned`) finds one top-level key `messages` written plainly, no other
  key that could decode to it (one written with an escape), and an array of objects under it.
A body that extends a layout's prefix is scanned from where the prefix ends: the new messages, the
array's end, and whatever follows unless it is the earlier body's own ending (already shown to hold
no second `messages` key). Anything else is digested message by message, as without this module.

Nothing of any tenant's content is served from here: a digest is taken over only for bytes the
caller sent again. The bodies are held for a while (by count and bytes), like the seen messages.

The parse itself is bounded the same way (`spliced`): a recent checked body's messages are held as
they were parsed (within `parsed_bytes` of their bodies), found again by the bytes up to the end of a
body's second message, and a body that begins with its bytes up to the end of its k-th message is
parsed without them: only its first message and what follows the k-th are read, and the k - 1
messages between are that body's own objects (equal values: the same bytes). The caller takes the
splice only where `lay_out` then shows the rest of the bytes hold no other array of messages.
"""
from __future__ import annotations

import re
import threading
from typing import Any, NamedTuple, Sequence

import orjson

from gateway.wire.json_body import parse_plainly_but
from policies.canonical import exact_digest, text_digest, trim_oldest

# From a place outside any string: everything up to the next bracket or brace (strings skipped whole).
_STRUCTURE = re.compile(rb'[^"\[\]{}]*+(?:"(?:[^"\\]++|\\.)*+"[^"\[\]{}]*+)*+([\[\]{}])')
# Tokens of an object's own level: strings, brackets and braces, colons and commas.
_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{}:,]')
_SPACE = b" \t\n\r"
_SPACES = re.compile(rb"[ \t\n\r]*")
_MESSAGES_HINT = re.compile(rb'"messages"[ \t\n\r]*:[ \t\n\r]*\[')
_MESSAGES = b'"messages"'
_PLAIN_START = b'{"messages":['  # as the OpenAI SDK writes a chat body: its messages first
MIN_SPLICED_BYTES = 16 * 1024  # a splice spares the parse of at least this many bytes, or is not tried


class Layout:
    __slots__ = ("raw", "ends", "close", "digests", "compact", "checked", "messages")

    def __init__(self, raw: bytes, ends: list[int], close: int, digests: list[bytes | None], compact: bool) -> None:
        self.raw = raw
        self.ends = ends  # the offset just past each message
        self.close = close  # the offset of the `]` closing the messages
        self.digests = digests
        self.compact = compact  # `raw` is exactly orjson's text of its parse
        self.checked = False  # the body passed its format's checks (`BodyLayouts.passed`)
        self.messages: tuple[Any, ...] | None = None  # as parsed, while `BodyLayouts.spliced` may share them


class Laid(NamedTuple):
    """A body's digests, its layout (None: not laid out), and how many of its first messages are those of
    a body that passed its format's checks (their bytes are that body's)."""

    digests: list[bytes | None]
    layout: Layout | None
    checked: int


Key = tuple[bytes | None, bytes | None]
MAX_SCANNED_SHARE = 4  # bytes scanned at most 1/4 of the bytes recognised: a scan costs ~4x a digest per byte


def _element_ends(raw: bytes, start: int, most: int = 0) -> tuple[list[int], int] | None:
    """The ends of the objects of an array from `start` (just inside its `[`, or just past one of its
    elements), and the offset of its `]`; None where an element is no object. With `most`, only the
    first `most` ends are looked for (the offset of the `]` is then -1)."""
    ends: list[int] = []
    depth, position = 0, start
    for match in _STRUCTURE.finditer(raw, start):
        if match.start() != position:
            return None
        position = match.end()
        char = match.group(1)
        if char == b"{" or char == b"[":
            if depth == 0 and char == b"[":
                return None
            depth += 1
        elif depth == 0:
            return (ends, match.start(1)) if char == b"]" else None
        else:
            depth -= 1
            if depth == 0:
                ends.append(position)
                if len(ends) == most:
                    return ends, -1
    return None


def _object_level(raw: bytes, start: int, stop_at: bytes | None) -> int | None:
    """Walk the top-level object at its own level from `start` (just past `{`, or past a value):
    None if a key may be `messages` (a plain `"messages"`, or one written with an escape) before
    `stop_at`, where the walk stops (the offset past its colon is returned); without `stop_at`, the
    offset past the object's closing brace, which ends the text but for white space."""
    depth = 0
    expect_key = start > 0 and raw[start - 1] == 0x7B  # just past the opening brace
    pending: bytes | None = None
    for match in _TOKEN.finditer(raw, start):
        token = match.group()
        if token[0] == 0x22:  # a string
            if depth == 0 and expect_key:
                pending = token
            continue
        if token == b":":
            if depth == 0 and pending is not None:
                if pending == stop_at:
                    return match.end()
                if pending == _MESSAGES or b"\\" in pending:
                    return None
            pending, expect_key = None, False
        elif token == b",":
            expect_key = depth == 0
        elif token == b"{" or token == b"[":
            depth += 1
        elif depth:
            depth -= 1
        elif token != b"}" or stop_at is not None or raw[match.end():].strip(_SPACE):
            return None
        else:
            return match.end()
    return None


def _messages_start(raw: bytes) -> int | None:
    """The offset just inside the `[` of a body's top-level `messages` (the only key that may be it)."""
    if raw.startswith(_PLAIN_START):
        return len(_PLAIN_START)
    offset = _past_space(raw, 0)
    if raw[offset:offset + 1] != b"{":
        return None
    after_key = _object_level(raw, offset + 1, _MESSAGES)
    if after_key is None:
        return None
    start = _past_space(raw, after_key)
    return start + 1 if raw[start:start + 1] == b"[" else None


def _past_space(raw: bytes, position: int) -> int:
    """The offset of the first byte at or after `position` that is no JSON white space (no copy of `raw`)."""
    return _SPACES.match(raw, position).end()  # type: ignore[union-attr]


def _scanned(raw: bytes, count: int) -> tuple[list[int], int] | None:
    """Message ends and the array's close in a body of any spacing, found by scanning it whole."""
    start = _messages_start(raw)
    found = _element_ends(raw, start) if start is not None else None
    if found is None or len(found[0]) != count or _object_level(raw, found[1] + 1, None) is None:
        return None
    return found


def _head(raw: bytes) -> bytes | None:
    """A body's bytes up to the end of its second message, found without parsing it (None: not found).
    Only a key to look up held bodies by (`BodyLayouts.spliced` shows what it found): the first array
    after a `"messages":` anywhere is taken for the messages, without a walk over what precedes it."""
    hint = _MESSAGES_HINT.search(raw)
    found = _element_ends(raw, hint.end(), most=2) if hint is not None else None
    return raw[:found[0][1]] if found is not None and len(found[0]) == 2 else None


def _texts_from(raw: bytes, position: int, texts: Sequence[bytes], first: bool) -> tuple[list[int], int] | None:
    """The ends of `texts` written one after the other from `position`, comma-separated (and a comma
    before the first unless `first`), and the offset past the last; None where `raw` holds other bytes."""
    ends = []
    for number, text in enumerate(texts):
        if number or not first:
            if raw[position:position + 1] != b",":
                return None
            position += 1
        if not raw.startswith(text, position):
            return None
        position += len(text)
        ends.append(position)
    return ends, position


def _ending(body: dict[str, Any]) -> bytes | None:
    """orjson's text of `body` from the `]` closing its messages."""
    keys = list(body)
    try:
        after = orjson.dumps({key: body[key] for key in keys[keys.index("messages") + 1:]})
    except TypeError:
        return None
    return b"]" + (b"," + after[1:] if len(after) > 2 else b"}")


def _as_orjson_writes(raw: bytes, body: dict[str, Any], texts: list[bytes]) -> tuple[list[int], int] | None:
    """Message ends and the array's close where `raw` is exactly orjson's text of `body` (whose messages
    are `texts`, orjson's text of each)."""
    keys = list(body)
    place = keys.index("messages")
    try:
        before = orjson.dumps({key: body[key] for key in keys[:place]})
    except TypeError:
        return None
    head = before[:-1] + (b',"messages":[' if place else b'"messages":[')
    if not raw.startswith(head):
        return None
    found = _texts_from(raw, len(head), texts, True)
    if found is None or raw[found[1]:] != _ending(body):
        return None
    return found


class BodyLayouts:
    """Recent chat bodies' layouts, by the digests of their first two messages (`per_key` bodies each),
    at most `limit_bytes` of bodies in all (the least recently used go first); and the parsed messages
    of recent checked bodies, by the bytes up to their second message's end (`per_key` bodies each), at
    most `parsed_bytes` of those bodies."""

    def __init__(self, limit_bytes: int = 64 * 1024 * 1024, per_key: int = 4,
                 parsed_bytes: int = 16 * 1024 * 1024) -> None:
        self.limit_bytes, self.per_key, self.parsed_bytes = limit_bytes, per_key, parsed_bytes
        self._layouts: dict[Key, list[Layout]] = {}
        self._sighted: dict[Key, None] = {}  # keys seen in a body not laid out (a scan waits for the second)
        self._held = 0
        self._parsed: dict[bytes, list[Layout]] = {}  # by `text_digest(_head(raw))`: those holding `messages`
        self._parsed_held = 0
        self._lock = threading.Lock()

    def spliced(self, raw: bytes) -> tuple[dict[str, Any], list[Any], tuple[Layout, int]] | None:
        """`parse_plainly_but(raw, "messages")` (the body, its messages unchecked) without parsing
        the messages `raw` shares with a recent checked body past its first, where it shares at least
        `MIN_SPLICED_BYTES` of them, and that body with how many it shares; None otherwise, or where the
        rest does not parse plainly (the caller parses whole, and any 400 names the place in the whole
        body). The caller confirms the splice with `lay_out` (`Laid.layout` not None) before anything
        else: the bytes after the shared messages are not looked at here (they may hold a second
        `messages` key, whose value the parse keeps)."""
        head = _head(raw)
        best, shared = _most_shared(raw, self._parsed.get(text_digest(head), ()) if head is not None else (), None)
        messages = best.messages if best is not None else None
        if best is None or messages is None or shared < 2 or best.ends[shared - 1] - best.ends[0] < MIN_SPLICED_BYTES:
            return None
        parsed = parse_plainly_but(raw[:best.ends[0]] + raw[best.ends[shared - 1]:], "messages")
        if parsed is None or not parsed[1]:
            return None
        body, rest = parsed
        rest = [rest[0], *messages[1:shared], *rest[1:]]
        body["messages"] = rest
        return body, rest, (best, shared)

    def lay_out(self, raw: bytes, body: dict[str, Any], based: tuple[Layout, int] | None = None) -> Laid:
        """`exact_digest` of each of `body["messages"]` (`body`: orjson's parse of `raw`, at least two
        messages), taken from a recent body for the messages whose bytes it holds. `based`: that body
        and how many messages `raw` shares with it, where the caller found them (`spliced`)."""
        messages = body["messages"]
        if based is not None:
            best, shared = based
            key = (best.digests[0], best.digests[1])  # the same bytes: the same messages
            found = self._extended_from(raw, body, best, shared)
        else:
            key = (exact_digest(messages[0]), exact_digest(messages[1]))
            found = self._extended(raw, body, key) if key in self._layouts else None
        layout, checked = found if found is not None else (self._laid_out(raw, body, key), 0)
        if layout is None:
            return Laid([exact_digest(message) for message in messages], None, 0)
        if not layout.ends:
            return Laid(layout.digests, None, 0)
        self._remember(key, layout)
        return Laid(layout.digests, layout, checked)

    def passed(self, laid: Laid, messages: list[Any]) -> None:
        """The body of `laid`, whose parse holds `messages`, passed its format's checks (each of which
        looks at a message and what precedes it alone, so any prefix of its messages passes them too):
        its messages are held for `spliced` (a copy of the list: the caller's may change)."""
        layout = laid.layout
        if layout is None:
            return
        layout.checked = True
        if len(layout.ends) < 2 or len(layout.raw) > self.parsed_bytes:
            return
        head = text_digest(layout.raw[:layout.ends[1]])
        with self._lock:
            again, dropped = _put_first(self._parsed, head, layout, self.per_key)
            if not again:
                layout.messages = tuple(messages)
                self._parsed_held += len(layout.raw)
            for entry in dropped:
                self._parsed_held -= len(entry.raw)
                entry.messages = None
            while self._parsed_held > self.parsed_bytes:
                for dropped in self._parsed.pop(next(iter(self._parsed))):
                    self._parsed_held -= len(dropped.raw)
                    dropped.messages = None

    @property
    def parsed_held_bytes(self) -> int:
        """The bytes of the bodies whose parsed messages are held for `spliced`."""
        return self._parsed_held

    def _extended(self, raw: bytes, body: dict[str, Any], key: Key) -> tuple[Layout, int] | None:
        """The layout of `raw` from the recent body sharing the most messages with it, if one does, and
        how many of them a checked body holds."""
        best, shared = _most_shared(raw, self._layouts.get(key, ()), len(body["messages"]))
        return self._extended_from(raw, body, best, shared) if best is not None else None

    @staticmethod
    def _extended_from(raw: bytes, body: dict[str, Any], best: Layout, shared: int) -> tuple[Layout, int] | None:
        """The layout of `raw`, whose first `shared` messages are `best`'s bytes, and how many of them a
        checked body holds; None where the rest of `raw` is not shown to be `body`'s other messages."""
        messages = body["messages"]
        checked = shared if best.checked else 0
        if len(raw) == len(best.raw) and raw == best.raw:
            return best, checked
        try:
            texts = [orjson.dumps(message) for message in messages[shared:]]
        except TypeError:
            return None
        found = _texts_from(raw, best.ends[shared - 1], texts, False) if best.compact else None
        rest = raw[found[1]:] if found is not None else None
        if rest is not None and (rest == best.raw[best.close:] or rest == _ending(body)):
            compact = True
        else:
            compact = False
            if (len(raw) - best.ends[shared - 1]) * MAX_SCANNED_SHARE > best.ends[shared - 1]:
                return None
            found = _element_ends(raw, best.ends[shared - 1])
            if found is None or shared + len(found[0]) != len(messages):
                return None
            if raw[found[1]:] != best.raw[best.close:] and _object_level(raw, found[1] + 1, None) is None:
                return None
        ends, close = found
        return Layout(raw, best.ends[:shared] + ends, close, best.digests[:shared] + list(map(text_digest, texts)),
                      compact), checked

    def _laid_out(self, raw: bytes, body: dict[str, Any], key: Key) -> Layout | None:
        """The layout of a body seen for the first time, where it can be shown (the module's docstring);
        a body of another spacing than orjson's is scanned only when its first two messages were seen
        before (a scan costs ~4x the digests). `ends` empty: the digests alone."""
        messages = body["messages"]
        try:
            texts = [orjson.dumps(message) for message in messages]
        except TypeError:
            return None
        digests: list[bytes | None] = list(map(text_digest, texts))
        found = _as_orjson_writes(raw, body, texts)
        compact = found is not None
        if found is None and key in self._sighted:
            found = _scanned(raw, len(messages))
        if found is None:
            with self._lock:
                self._sighted[key] = None
                trim_oldest(self._sighted, 4096)
            return Layout(raw, [], -1, digests, False)
        return Layout(raw, found[0], found[1], digests, compact)

    def _remember(self, key: Key, layout: Layout) -> None:
        with self._lock:
            again, dropped = _put_first(self._layouts, key, layout, self.per_key)
            self._held += (0 if again else len(layout.raw)) - sum(len(entry.raw) for entry in dropped)
            while self._held > self.limit_bytes and len(self._layouts) > 1:
                oldest = next(iter(self._layouts))
                self._held -= sum(len(entry.raw) for entry in self._layouts.pop(oldest))

    def __len__(self) -> int:
        return sum(map(len, self._layouts.values()))

    @property
    def held_bytes(self) -> int:
        return self._held


def _put_first(table: dict[Any, list[Layout]], key: Any, layout: Layout, per_key: int) -> tuple[bool, list[Layout]]:
    """`layout` first among `table[key]`, the key last in `table` (the most recently used), at most
    `per_key` layouts kept there: whether `layout` was there already, and the layouts dropped."""
    known = table.pop(key, [])
    kept = [layout, *(entry for entry in known if entry is not layout)]
    table[key] = kept[:per_key]
    return len(kept) == len(known), kept[per_key:]


def _most_shared(raw: bytes, known: Sequence[Layout], limit: int | None) -> tuple[Layout | None, int]:
    """The body of `known` whose first messages (at most `limit`; None: all) `raw` holds the most of in
    the same bytes, and how many; (None, 0) where none shares one."""
    best, shared = None, 0
    for layout in known:
        if best is None or (len(layout.ends) > shared
                            and raw.startswith(memoryview(layout.raw)[:layout.ends[shared]])):
            count = _shared_messages(raw, layout, len(layout.ends) if limit is None else limit)
            if count > shared:
                best, shared = layout, count
    return best, shared


def _shared_messages(raw: bytes, layout: Layout, limit: int) -> int:
    """How many of `layout`'s first messages (at most `limit`) `raw` holds in the same bytes."""
    ends, held = layout.ends, memoryview(layout.raw)
    top = min(len(ends), limit)
    if top and raw.startswith(held[:ends[top - 1]]):
        return top
    low, high = 0, top - 1  # raw holds the first `low` messages, not the first `high + 1`
    if high - 2 > low and raw.startswith(held[:ends[high - 2]]):  # a resend without the last tool round
        low = high - 1
    while low < high:
        middle = (low + high + 1) // 2
        if raw.startswith(held[:ends[middle - 1]]):
            low = middle
        else:
            high = middle - 1
    return low
