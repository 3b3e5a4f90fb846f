"""Deterministic extractors: a tool artifact rendered as a compact memory.

A memory is a pure function of the artifact's bytes and metadata and the
policy: the same artifact under the same policy version renders to the same
bytes every time, which keeps the forwarded prefix cache-stable. Text lifted
from a tool result is untrusted: it sits inside a fence whose tag carries a
nonce derived from the content's hash, and any fence-like sequence inside the
text is escaped, so the content can neither close the fence nor pass for the
gateway's own words.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from policies.policy import Compaction, ToolRule

_PATH_LIKE = re.compile(r"^[\w.\-~/]+/?$|^[dl-][rwx\-]{9}\s")


@dataclass(frozen=True)
class ArtifactView:
    """What the assembler knows of one tool result."""

    artifact_id: str
    tool_name: str | None
    arguments: str | None
    status: str  # ok | error | pending
    content: str
    sha256: str
    tokens: int
    observed_at: float  # unix seconds
    owner_participant: str = ""


def escape_untrusted(text: str) -> str:
    """Neutralise fence markers inside lifted text."""
    return text.replace("<<<", "<<\\<").replace(">>>", ">>\\>")


def _clip(line: str, limit: int) -> str:
    if len(line) <= limit:
        return line
    return f"{line[:limit]}...[+{len(line) - limit} chars]"


_LETTER = re.compile(r"[^\W\d_]")


def _is_noise(line: str) -> bool:
    """Progress bars, rulers and tables of numbers: lines with almost no words."""
    return len(line) >= 12 and len(_LETTER.findall(line)) < 0.25 * len(line)


def _take(lines: list[str], budget: int, limit: int) -> list[str]:
    """Lines from the front of `lines` until `budget` characters are used."""
    out: list[str] = []
    used = 0
    for line in lines:
        clipped = _clip(line, limit)
        if out and used + len(clipped) > budget:
            break
        out.append(clipped)
        used += len(clipped) + 1
        if used >= budget:
            break
    return out


def _text_excerpt(text: str, c: Compaction) -> list[str]:
    """The opening and the end of a text, by character budget, blank lines and runs of spaces folded."""
    lines = [" ".join(line.split()) for line in text.split("\n")]
    lines = [line for line in lines if line and not _is_noise(line)] or [line for line in lines if line]
    head = _take(lines, c.head_chars, c.max_line_chars)
    rest = lines[len(head):]
    tail = _take(rest[::-1], c.tail_chars, c.max_line_chars)[::-1] if rest else []
    omitted = len(rest) - len(tail)
    if omitted <= 0:
        return head + tail
    return [*head, f"[... {omitted} lines omitted ...]", *tail]


def _json_outline(value: Any, depth: int, width: int) -> str:
    if isinstance(value, dict):
        if depth >= 2:
            return f"{{{len(value)} keys}}"
        parts = [f"{json.dumps(k, ensure_ascii=False)}: {_json_outline(v, depth + 1, width)}"
                 for k, v in list(value.items())[:16]]
        more = f", ...{len(value) - 16} more keys" if len(value) > 16 else ""
        return "{" + ", ".join(parts) + more + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        if depth >= 2:
            return f"[{len(value)} items]"
        first = _json_outline(value[0], depth + 1, width)
        return f"[{len(value)} items; first: {first}]" if len(value) > 1 else f"[{first}]"
    rendered = json.dumps(value, ensure_ascii=False)
    return rendered if len(rendered) <= width else rendered[:width] + '..."'


def _json_excerpt(text: str, c: Compaction) -> list[str] | None:
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    outline = _json_outline(value, 0, 60)
    return ["JSON outline: " + _clip(outline, c.head_chars + c.tail_chars)]


def _listing_excerpt(text: str, c: Compaction) -> list[str] | None:
    lines = [line for line in text.split("\n") if line.strip()]
    if len(lines) < 12 or sum(1 for line in lines if _PATH_LIKE.match(line.strip())) < 0.8 * len(lines):
        return None
    dirs = sum(1 for line in lines if line.rstrip().endswith("/") or line.startswith("d"))
    head = _take(lines, c.head_chars + c.tail_chars, c.max_line_chars)
    rest = len(lines) - len(head)
    summary = f"listing of {len(lines)} entries ({dirs} directories)"
    return [summary, *head] + ([f"[... {rest} more entries ...]"] if rest > 0 else [])


def _error_excerpt(text: str, c: Compaction) -> list[str]:
    if len(text) <= c.error_max_chars:
        return text.split("\n")
    return _text_excerpt(text, c)


def excerpt(view: ArtifactView, rule: ToolRule, c: Compaction) -> list[str]:
    """The lines of the memory's body, by the rule's extractor."""
    kind = rule.extractor
    text = view.content
    if kind == "error" or (kind == "auto" and view.status == "error"):
        return _error_excerpt(text, c)
    if kind in ("json", "auto"):
        lines = _json_excerpt(text, c)
        if lines is not None:
            return lines
    if kind in ("listing", "auto"):
        lines = _listing_excerpt(text, c)
        if lines is not None:
            return lines
    return _text_excerpt(text, c)


def _size_note(view: ArtifactView) -> str:
    lines = view.content.count("\n") + 1 if view.content else 0
    return f"{lines} lines, {view.tokens} tokens"


def render_memory(view: ArtifactView, rule: ToolRule, c: Compaction, stale_note: str | None = None) -> str:
    """The compact, model-facing form of one tool result."""
    nonce = view.sha256[:6]
    header = f"[compacted artifact:{view.artifact_id}; {view.tool_name or 'tool'} {view.status}; {_size_note(view)}; untrusted excerpt:]"
    body = "\n".join(escape_untrusted(line) for line in excerpt(view, rule, c))
    parts = [header]
    if stale_note:
        parts.append(stale_note)
    parts.append(f"<<<{nonce}\n{body}\n>>>{nonce}")
    return "\n".join(parts)


def render_notice(view: ArtifactView, reason: str) -> str:
    """What stands in for a result whose content may not be shown at all."""
    return (
        f"[tool result withheld artifact:{view.artifact_id} | {view.tool_name or 'tool'}"
        f" | {view.status} | {reason}]"
    )


def compact_arguments(arguments: str, artifact_ref: str, c: Compaction, min_chars: int) -> str:
    """Call arguments with their long string values replaced by a short excerpt.

    The result is still a JSON object (providers parse it), its short fields
    unchanged, so the model keeps seeing what the call did (path, command).
    """
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        head = escape_untrusted(arguments[: c.max_line_chars])
        return json.dumps({"compacted": f"artifact:{artifact_ref}", "chars": len(arguments), "head": head},
                          ensure_ascii=False)
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, str) and len(item) > min_chars:
            lines = item.split("\n")
            first = escape_untrusted(_clip(lines[0], 80))
            out[key] = f"[compacted: {len(item)} chars, {len(lines)} lines, starts {first!r}; exact: artifact:{artifact_ref}]"
        else:
            out[key] = item
    return json.dumps(out, ensure_ascii=False)
