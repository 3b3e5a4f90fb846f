"""Token counting with tiktoken.

Pure: where tiktoken finds its encoding files is the caller's to set before the
first count (gateway/upstream/encodings.py points it at the files LiteLLM ships, offline).
"""
from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from typing import Any, Mapping

import tiktoken

DEFAULT_ENCODING = "o200k_base"
MESSAGE_OVERHEAD = 4  # per-message framing, as OpenAI documents for chat models
TOOL_CALL_OVERHEAD = 4


@functools.lru_cache(maxsize=8)
def encoding(name: str = DEFAULT_ENCODING) -> tiktoken.Encoding:
    return tiktoken.get_encoding(name)


@functools.lru_cache(maxsize=65536)
def _cached_count(text: str, name: str) -> int:
    return len(encoding(name).encode(text, disallowed_special=()))


_LONG_COUNTS: OrderedDict[tuple[bytes, str], int] = OrderedDict()
_LONG_COUNTS_SIZE = 65536  # digests and counts: about 10 MB full
_LONG_COUNTS_LOCK = threading.Lock()


def _count_long(text: str, name: str) -> int:
    """Long texts (tool outputs re-sent every turn) are cached by digest: numbers, not texts."""
    key = (hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest(), name)
    with _LONG_COUNTS_LOCK:
        if key in _LONG_COUNTS:
            _LONG_COUNTS.move_to_end(key)
            return _LONG_COUNTS[key]
    count = len(encoding(name).encode(text, disallowed_special=()))
    with _LONG_COUNTS_LOCK:
        _LONG_COUNTS[key] = count
        if len(_LONG_COUNTS) > _LONG_COUNTS_SIZE:
            _LONG_COUNTS.popitem(last=False)
    return count


_SHORT_TEXT = 512  # counts of texts up to this long are remembered by the text itself (65,536 of them)


def count_text(text: str, name: str = DEFAULT_ENCODING) -> int:
    if not text:
        return 0
    if len(text) > _SHORT_TEXT:
        return _count_long(text, name)
    return _cached_count(text, name)


def content_tokens(content: Any, name: str = DEFAULT_ENCODING) -> int:
    if isinstance(content, str):
        return count_text(content, name)
    if isinstance(content, list):  # text parts; a thinking block's text; the parts of a nested item
        total = 0
        for part in content:
            if not isinstance(part, Mapping):
                continue
            total += sum(count_text(part[key], name) for key in ("text", "thinking") if isinstance(part.get(key), str))
            total += sum(content_tokens(part[key], name) for key in ("content", "summary")
                         if isinstance(part.get(key), list))
        return total
    return 0


def message_tokens(message: Mapping[str, Any], name: str = DEFAULT_ENCODING) -> int:
    """Tokens of one chat message as a provider counts it: content and tool calls."""
    total = MESSAGE_OVERHEAD + content_tokens(message.get("content"), name)
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        total += TOOL_CALL_OVERHEAD
        total += count_text(function.get("name") or "", name)
        total += count_text(function.get("arguments") or "", name)
    return total


def messages_tokens(messages: list[Mapping[str, Any]], name: str = DEFAULT_ENCODING) -> int:
    return sum(message_tokens(m, name) for m in messages)


@functools.lru_cache(maxsize=512)
def encoding_for_model(model: str) -> str:
    """The tiktoken encoding for a model name (provider prefix allowed), o200k_base if unknown."""
    name = model.split("/")[-1]
    try:
        return tiktoken.encoding_name_for_model(name)
    except KeyError:
        return DEFAULT_ENCODING
