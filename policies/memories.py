"""Deterministic extractors: a tool artifact rendered as a compact memory.

A memory is a pure function of the artifact's bytes and metadata and the
policy: the same artifact under the same policy version renders to the same
bytes every time, which keeps the forwarded prefix cache-stable. Text lifted
from a tool result is untrusted: it sits inside a fence whose tag carries a
nonce derived from the content's hash, and any fence-like sequence inside the
text is escaped, so the content can neither close the fence nor pass for the
gateway's own words.

Which lines a memory keeps is chosen by policies/excerpts.py (text, listings, errors) and
policies/json_excerpt.py (JSON values); this module picks the extractor, renders the fenced memory,
and compacts long call arguments.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any, Mapping

from policies.bounded_cache import BoundedCache
from policies.excerpts import Kept, Salience, clip, error_excerpt, folded_lines, listing_excerpt, terms_of, text_excerpt
from policies.json_excerpt import json_excerpt, json_leaves
from policies.policy import Compaction, ToolRule
from policies.redaction import Redactor
from policies.transcript import short_ref


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


def text_free(view: ArtifactView) -> ArtifactView:
    """`view` as a cache key that keeps no result text alive: its content left out (its sha256 names
    it: the content is the result's bytes decoded), long call arguments named by their own digest."""
    arguments = view.arguments
    if arguments is not None and len(arguments) > 256:
        arguments = "sha256:" + hashlib.sha256(arguments.encode("utf-8", "surrogatepass")).hexdigest()
    return replace(view, content="", arguments=arguments)


SHA_CHARS = 10  # of the whole result's sha256, in a memory's header: checkable against the artifact's
NONCE_CHARS = 4  # the fence's tag: markers inside the text are escaped, so it cannot be closed early anyway


def escape_untrusted(text: str) -> str:
    """Neutralise fence markers inside lifted text."""
    return text.replace("<<<", "<<\\<").replace(">>>", ">>\\>")


# terms_in by the result's sha256 (its content is a function of it): a cache keyed by the content
# itself held every result's text as long as the entry lived.
_TERMS_IN = BoundedCache(4096)


def _terms_in(content: str) -> frozenset[str]:
    found: set[str] = set()
    for line in folded_lines(content):
        found |= terms_of(line.text)
    stripped = content.strip()
    if stripped[:1] in ("[", "{"):
        try:
            value = json.loads(stripped)
        except ValueError:
            value = None
        if value is not None:
            for path, text in json_leaves(value):
                found |= terms_of(f"{path}: {text}")
    return frozenset(found)


def terms_in(view: ArtifactView) -> frozenset[str]:
    """Every identifier or amount any line an extractor may weigh holds (a superset): a memory
    depends on the conversation's named terms only through these."""
    found = _TERMS_IN.get(view.sha256)
    if found is None:
        found = _terms_in(view.content)
        _TERMS_IN.put(view.sha256, found)
    return found


_HOLDS = BoundedCache(16384)


def holds(view: ArtifactView, phrase: str) -> bool:
    """Whether the result holds `phrase` (casefolded), remembered by the result's sha256."""
    key = (view.sha256, phrase)
    found = _HOLDS.get(key)
    if found is None:
        found = phrase in view.content.casefold()
        _HOLDS.put(key, found)
    return found


_MIN_LINE_CHARS = 40


def budget_for(c: Compaction, chars: int) -> Compaction:
    """`c` for a result of `chars` characters: under `excerpt_share`, its opening and end take at most
    that share of them, and so does any one line (at least `_MIN_LINE_CHARS`). The lines that carry a
    decision keep their own budget."""
    if c.excerpt_share is None:
        return c
    full = c.head_chars + c.tail_chars
    room = int(c.excerpt_share * chars)
    if room >= full and room >= c.max_line_chars:
        return c
    scale = min(1.0, room / full) if full > 0 else 1.0
    return c.model_copy(update={
        "head_chars": int(c.head_chars * scale), "tail_chars": int(c.tail_chars * scale),
        "max_line_chars": max(_MIN_LINE_CHARS, min(c.max_line_chars, room)),
    })


def excerpt(view: ArtifactView, rule: ToolRule, c: Compaction, terms: frozenset[str] = frozenset(),
            asked: frozenset[str] = frozenset(), phrases: frozenset[str] = frozenset()) -> list[Kept]:
    """The lines of the memory's body, by the rule's extractor, each with why it was kept; what the
    conversation named of it: `terms`, those of them a user turn `asked` about, and the quoted terms
    and paths (`phrases`, casefolded) a user turn asked about."""
    kind = rule.extractor
    text = view.content
    window = c.max_line_chars  # a deciding line's window keeps its width whatever the result's size
    salience = Salience(patterns=(*c.salient_patterns, *rule.salient), terms=terms, asked=asked, phrases=phrases)
    c = budget_for(c, len(text))
    if kind == "error" or (kind == "auto" and view.status == "error"):
        return error_excerpt(text, c, salience, window)
    if kind in ("json", "auto"):
        lines = json_excerpt(text, c, salience, window)
        if lines is not None:
            return lines
    folded = folded_lines(text)  # a listing's lines and a text's: folded once
    if kind in ("listing", "auto"):
        lines = listing_excerpt(text, c, folded)
        if lines is not None:
            return lines
    return text_excerpt(text, c, salience, window, folded)


def _size_note(view: ArtifactView) -> str:
    lines = view.content.count("\n") + 1 if view.content else 0
    return f"{lines} lines, {view.tokens} tokens" if lines > 1 else f"{view.tokens} tokens"


def kept_summary(lines: list[Kept], redacted: Mapping[str, int] | None = None) -> str:
    """Which artifact lines a memory kept and why, runs of one reason joined: "1-3 head; 24 condition";
    and what was redacted from them: "; redacted email x2"."""
    parts: list[tuple[int, int, str]] = []
    for line in lines:
        if not line.number:
            continue
        last = max(line.number, line.through)
        if parts and parts[-1][2] == line.why and parts[-1][1] + 1 >= line.number:
            parts[-1] = (parts[-1][0], last, line.why)
        else:
            parts.append((line.number, last, line.why))
    summary = [f"{a}-{b} {why}" if b > a else f"{a} {why}" for a, b, why in parts]
    if redacted:
        summary.append("redacted " + ", ".join(f"{kind} x{count}" for kind, count in redacted.items()))
    return "; ".join(summary)


def render_memory(view: ArtifactView, rule: ToolRule, c: Compaction, stale_note: str | None = None,
                  terms: frozenset[str] = frozenset(), lines: list[Kept] | None = None) -> str:
    """The compact, model-facing form of one tool result (`lines`: its excerpt, if already taken)."""
    nonce = view.sha256[:NONCE_CHARS]
    status = "" if view.status == "ok" else f" {view.status}"
    header = (f"[compacted artifact:{short_ref(view.artifact_id)}{status}; "
              f"{_size_note(view)}, sha256 {view.sha256[:SHA_CHARS]}; untrusted excerpt:]")
    if lines is None:
        lines = excerpt(view, rule, c, terms)
    body = "\n".join(escape_untrusted(line.render()) for line in lines)
    parts = [header]
    if stale_note:
        parts.append(stale_note)
    parts.append(f"<<<{nonce}\n{body}\n>>>{nonce}")
    return "\n".join(parts)


def render_notice(view: ArtifactView, reason: str) -> str:
    """What stands in for a result whose content may not be shown at all."""
    return (
        f"[tool result withheld artifact:{short_ref(view.artifact_id)} | {view.tool_name or 'tool'}"
        f" | {view.status} | {reason}]"
    )


def _opening(text: str, limit: int, redactor: Redactor | None) -> str:
    """The first `limit` characters, redacted. A secret that starts before the cut and runs past it is
    still recognised: redaction looks a bounded way past the cut, far enough for any one-line secret."""
    if not redactor:
        return text[:limit]
    return redactor.redact(text[: limit + _LOOK_PAST]).text[:limit]


def _clip_redacted(line: str, limit: int, redactor: Redactor | None) -> str:
    """`clip` of the line redacted (the same text as `clip` when nothing is redacted)."""
    if not redactor:
        return clip(line, limit)
    window = line[: limit + _LOOK_PAST]
    shown = redactor.redact(window).text
    unseen = len(line) - len(window)
    return clip(shown, limit) if not unseen else f"{shown[:limit]}...[+{len(shown) - limit + unseen} chars]"


_LOOK_PAST = 512


def compact_arguments(arguments: str, artifact_ref: str, c: Compaction, min_chars: int,
                      redactor: Redactor | None = None) -> str:
    """Call arguments with their long string values replaced by a short excerpt.

    The result is still a JSON object (providers parse it), its short fields
    unchanged, so the model keeps seeing what the call did (path, command).
    """
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        head = escape_untrusted(_opening(arguments, c.max_line_chars, redactor))
        return json.dumps({"compacted": f"artifact:{short_ref(artifact_ref)}", "chars": len(arguments), "head": head},
                          ensure_ascii=False)
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, str) and len(item) > min_chars:
            lines = item.split("\n")
            first = escape_untrusted(_clip_redacted(lines[0], 80, redactor))
            out[key] = (f"[compacted: {len(item)} chars, {len(lines)} lines, starts {first!r}; "
                        f"exact: artifact:{short_ref(artifact_ref)}]")
        else:
            out[key] = item
    return json.dumps(out, ensure_ascii=False)
