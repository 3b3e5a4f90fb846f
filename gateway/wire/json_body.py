"""Reading a JSON request body safely: every defect is a 400 that names where it is.

`json.loads` alone accepts what no provider does (`NaN`, `Infinity`, lone
UTF-16 surrogates such as `"\\ud800"`) and recurses without a bound on deep
nesting. Here the body is parsed with those refused, and walked once to bound
its depth and find any lone surrogate, so what reaches the pipeline can be
stored (PostgreSQL refuses surrogates and NUL in text) and forwarded as is.
"""
from __future__ import annotations

import json
import re
from typing import Any

import orjson

from gateway.errors import InvalidRequest

MAX_DEPTH = 64
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_constant(name: str) -> Any:
    raise InvalidRequest(f"the request body is not valid JSON: {name} is not a JSON number", code="invalid_json")


def param_path(loc: tuple[Any, ...]) -> str:
    """('messages', 2, 'content') -> messages[2].content"""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _walk(value: Any, loc: tuple[Any, ...], check_strings: bool) -> None:
    if len(loc) > MAX_DEPTH:
        raise InvalidRequest(f"{param_path(loc[:MAX_DEPTH])}: nested deeper than {MAX_DEPTH} levels",
                             param=param_path(loc[:MAX_DEPTH]) or None, code="invalid_json")
    if isinstance(value, dict):
        for key, item in value.items():
            if check_strings and _SURROGATE.search(key):
                raise _surrogate(loc)
            _walk(item, (*loc, key), check_strings)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _walk(item, (*loc, index), check_strings)
    elif check_strings and isinstance(value, str) and _SURROGATE.search(value):
        raise _surrogate(loc)


def _surrogate(loc: tuple[Any, ...]) -> InvalidRequest:
    param = param_path(loc) or None
    return InvalidRequest(f"{param or 'the request body'}: a lone UTF-16 surrogate (\\ud800-\\udfff) is not text",
                          param=param, code="invalid_json")


_BIG_INTEGER = float(2 ** 63)


def _plainly_parsed(value: Any, limit: int = MAX_DEPTH - 1, left: Any = None) -> bool:
    """Whether orjson's parse of a body is what `json.loads` gives and is shallow enough, checked by a
    walk over containers only (strings need no look: orjson refuses lone surrogates): nested at most
    `limit` levels, and no float that may have been an integer literal past 64 bits (orjson reads
    those as floats, `json.loads` as ints). The items of the container `left` (by identity) are not
    looked at: the caller checks them (`plain_item`)."""
    level, depth = [value], 0
    while level:
        depth += 1
        if depth > limit:
            return False
        deeper = []
        for container in level:
            if container is left:
                continue
            for item in (container.values() if type(container) is dict else container):
                kind = type(item)
                if kind is dict or kind is list:
                    deeper.append(item)
                elif kind is float and abs(item) >= _BIG_INTEGER and item.is_integer():
                    return False
        level = deeper
    return True


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or InvalidRequest (code invalid_json) naming the problem.

    orjson parses at C speed what it can read exactly as `json.loads` does; anything else (a defect, a
    lone surrogate, NaN, a huge number, deep nesting, a byte order mark) takes the path below, whose
    answer, value or error, is the one given."""
    return parse_json_object_but(raw, None)[0]


def parse_json_object_but(raw: bytes, key: str | None) -> tuple[dict[str, Any], list[Any] | None]:
    """`parse_json_object`, except that where orjson reads the body and its `key` is a list, that
    list's items are left unchecked and the list is returned with the body: the caller checks the
    items it needs to with `plain_item` (a chat request's messages: those seen before need no look,
    gateway/wire/openai_chat.py), and must parse with `parse_json_object` when one is not plain.
    Otherwise (and for `key` None) the list is None and everything was checked."""
    return parse_plainly_but(raw, key) or (_parse_slowly(raw), None)


def parse_plainly_but(raw: bytes, key: str | None) -> tuple[dict[str, Any], list[Any] | None] | None:
    """`parse_json_object_but` where orjson reads the body as `json.loads` does, else None (no error:
    the caller's whole parse names it)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(body) is dict:
        items = body.get(key)
        left = items if type(items) is list else None
        if _plainly_parsed(body, left=left):
            return body, left
    return None


def plain_item(item: Any) -> bool:
    """`_plainly_parsed` for an item of the list `parse_json_object_but` left, as deep in the body as
    a list item under a top-level key."""
    kind = type(item)
    if kind is dict or kind is list:
        return _plainly_parsed(item, MAX_DEPTH - 3)
    return not (kind is float and abs(item) >= _BIG_INTEGER and item.is_integer())


def _parse_slowly(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise InvalidRequest("the request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError as exc:
        raise InvalidRequest(f"the request body is nested deeper than {MAX_DEPTH} levels",
                             code="invalid_json") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_json")
    # Valid UTF-8 cannot hold a surrogate: only a \\uD8xx-\\uDFxx escape makes one.
    _walk(body, (), check_strings=bool(_SURROGATE_ESCAPE.search(raw)))
    return body


def check_text(value: str, param: str) -> str:
    """An id, name or header value: no NUL and no lone surrogate (storage refuses both)."""
    if "\x00" in value:
        raise InvalidRequest(f"{param}: may not contain NUL characters", param=param)
    if _SURROGATE.search(value):
        raise InvalidRequest(f"{param}: a lone UTF-16 surrogate is not text", param=param)
    return value


def check_count(body: dict[str, Any], key: str, limit: int | None) -> dict[str, Any]:
    """`body`, when its transcript (the list under `key`) holds at most `limit` items (None: any number);
    else a 400 naming the limit, before any item is checked (server.max_messages)."""
    items = body.get(key)
    if limit is not None and isinstance(items, list) and len(items) > limit:
        raise InvalidRequest(f"{key}: {len(items)} items; this gateway takes at most {limit} per request"
                             " (server.max_messages)", param=key, code="too_many_messages")
    return body
