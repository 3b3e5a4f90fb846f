"""Token counting with tiktoken.

Pure: where tiktoken finds its encoding files is the caller's to set before the
first count (gateway/upstream/encodings.py points it at the files LiteLLM ships, offline).
"""
from __future__ import annotations

import hashlib
from typing import Any, Mapping

import tiktoken
import tiktoken.registry

from policies.bounded_cache import BoundedCache
from policies.memo import memo

DEFAULT_ENCODING = "o200k_base"
MESSAGE_OVERHEAD = 4  # per-message framing, as OpenAI documents for chat models
TOOL_CALL_OVERHEAD = 4


@memo(maxsize=8)
def encoding(name: str = DEFAULT_ENCODING) -> tiktoken.Encoding:
    return lightened(tiktoken.get_encoding(name))


def lightened(found: tiktoken.Encoding) -> tiktoken.Encoding:
    """`found` without its Python dict of merge ranks, which tiktoken keeps beside the Rust core that
    encodes and decodes with its own copy. Only pickling reads the dict, and tiktoken pickles an encoding
    of its registry (these are) by name. 31 MB of every process's resident memory for o200k_base
    (measured: load, drop, collect, `malloc_trim`)."""
    core = getattr(found, "_core_bpe", None)
    if core is not None and isinstance(getattr(found, "_mergeable_ranks", None), dict):
        found._mergeable_ranks = None  # type: ignore[assignment]
    return found


def lighten_loaded() -> list[str]:
    """Lighten every encoding tiktoken has loaded so far, whoever asked for it (LiteLLM loads
    cl100k_base for its own counts: 13 MB of resident memory in its ranks); their names."""
    loaded = dict(tiktoken.registry.ENCODINGS)
    for found in loaded.values():
        lightened(found)
    return sorted(loaded)


@memo(maxsize=65536)
def _cached_count(text: str, name: str) -> int:
    return len(encoding(name).encode(text, disallowed_special=()))


# (sha256 of the text, encoding) -> tokens: keyed by digest, so no long text is kept alive
_LONG_COUNTS = BoundedCache(65536)  # digests and counts: about 10 MB full


def _count_long(text: str, name: str) -> int:
    """Long texts (tool outputs re-sent every turn) are cached by digest: numbers, not texts."""
    key = (hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest(), name)
    count = _LONG_COUNTS.get(key)
    if count is None:
        count = len(encoding(name).encode(text, disallowed_special=()))
        _LONG_COUNTS.put(key, count)
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


@memo(maxsize=512)
def encoding_for_model(model: str) -> str:
    """The tiktoken encoding for a model name (provider prefix allowed), o200k_base if unknown."""
    name = model.split("/")[-1]
    try:
        return tiktoken.encoding_name_for_model(name)
    except KeyError:
        return DEFAULT_ENCODING
