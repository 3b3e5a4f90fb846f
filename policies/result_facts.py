"""Facts the assembler reads off a result, each a pure function of its bytes and arguments:
the value at an argument path, a result's revision, a digest blind to timestamps, the short values
of a call's arguments. Memoised where every request asks again for the same results."""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Sequence

from policies.bounded_cache import BoundedCache
from policies.memo import memo
from policies.memories import ArtifactView

_LOOSE = BoundedCache(65536)


@memo(maxsize=16384)
def argument_value(arguments: str | None, path: str) -> str | None:
    """The value at `arguments.x.y` of a call's JSON arguments, canonicalised (several paths joined
    by commas: the values together). Memoised: every request of a conversation asks again for the
    same calls' values."""
    try:
        parsed: Any = json.loads(arguments or "")
    except ValueError:
        return None
    values = []
    for one in path.split(","):
        value = _at(parsed, one.split(".")[1:])
        if value is _MISSING:
            return None
        values.append(value)
    return json.dumps(values[0] if len(values) == 1 else values, sort_keys=True)


_MISSING = object()


def _at(value: Any, keys: Sequence[str]) -> Any:
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


def revision_of(view: ArtifactView, path: str) -> tuple[int, float | str] | None:
    """A result's revision at `arguments.x` or `result.x`, comparable: numbers before strings."""
    source, _, rest = path.partition(".")
    try:
        parsed = json.loads((view.arguments if source == "arguments" else view.content) or "")
    except ValueError:
        return None
    value = _at(parsed, rest.split("."))
    if value is _MISSING or value is None or isinstance(value, (dict, list, bool)):
        return None
    try:
        return (0, float(value))
    except (TypeError, ValueError):
        return (1, str(value))


def loose_digest(view: ArtifactView) -> str | None:
    """A digest of the output with timestamps and timings blanked (None: it has none), memoised by
    content hash: every request of a conversation asks again for the same outputs."""
    found = _LOOSE.get(view.sha256)
    if found is None:
        normal = _VOLATILE.sub("#", view.content)
        found = "" if normal == view.content else hashlib.sha256(normal.encode("utf-8", "surrogatepass")).hexdigest()
        _LOOSE.put(view.sha256, found)
    return found or None


# Timestamps and timings: ISO timestamps, clock times (`\b\d{1,2}:...`) and elapsed times (`\b\d+ ms`).
# Every branch starts with a digit, so the search skips ahead to digits; a word boundary before a
# digit is written as "no word character before it" (`(?<!\w\d)` once a digit is matched). The same
# matches as the plain alternation `VOLATILE_PLAIN` (tests/policies/test_result_facts.py), six times faster.
VOLATILE_PLAIN = (r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
                  r"|\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\b"
                  r"|\b\d+(?:\.\d+)?\s?(?:ms|s|sec|secs|seconds)\b")
_VOLATILE = re.compile(
    r"\d(?:\d{3}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"  # ISO timestamps
    r"|(?<!\w\d)(?:\d?:\d{2}:\d{2}(?:\.\d+)?\b"  # clock times
    r"|\d*(?:\.\d+)?\s?(?:ms|s|sec|secs|seconds)\b))"  # elapsed times
)


@memo(maxsize=16384)
def short_values(arguments: str) -> str:
    """The short scalar values of a call's JSON arguments (ids, amounts, names), not its commands,
    paths or file contents: what a later output may echo that matters."""
    try:
        value = json.loads(arguments or "")
    except (TypeError, ValueError):
        return ""
    out: list[str] = []

    def walk(item: Any) -> None:
        if isinstance(item, dict):
            for nested in item.values():
                walk(nested)
        elif isinstance(item, list):
            for nested in item:
                walk(nested)
        elif isinstance(item, (int, float)) and not isinstance(item, bool) or isinstance(item, str) and len(item) <= 40:
            out.append(str(item))

    walk(value)
    return " ".join(out)


def shown_revision(revision: tuple[int, float | str]) -> str:
    value = revision[1]
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
