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

import functools
import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping

from policies.bounded_cache import BoundedCache
from policies.policy import Compaction, ToolRule
from policies.redaction import Redactor

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


def text_free(view: ArtifactView) -> ArtifactView:
    """`view` as a cache key that keeps no result text alive: its content left out (its sha256 names
    it: the content is the result's bytes decoded), long call arguments named by their own digest."""
    arguments = view.arguments
    if arguments is not None and len(arguments) > 256:
        arguments = "sha256:" + hashlib.sha256(arguments.encode("utf-8", "surrogatepass")).hexdigest()
    return replace(view, content="", arguments=arguments)


NONCE_CHARS = 4  # the fence's tag: markers inside the text are escaped, so it cannot be closed early anyway


def escape_untrusted(text: str) -> str:
    """Neutralise fence markers inside lifted text."""
    return text.replace("<<<", "<<\\<").replace(">>>", ">>\\>")


def _clip(line: str, limit: int) -> str:
    if len(line) <= limit:
        return line
    return f"{line[:limit]}...[+{len(line) - limit} chars]"


_LETTER = re.compile(r"[^\W\d_]")


_PROGRESS_HEADER = re.compile(r"^% Total\s+% Received|^Dload\s+Upload\s+Total")  # curl's progress meter


def _is_noise(line: str) -> bool:
    """Progress bars, rulers and tables of numbers: lines with almost no words."""
    return len(line) >= 12 and len(_LETTER.findall(line)) < 0.25 * len(line) or bool(_PROGRESS_HEADER.match(line))


@dataclass(frozen=True)
class Kept:
    """One line of a memory's excerpt: where it was in the artifact and why it was kept."""

    number: int  # 1-based line of the artifact; 0 for a line the extractor wrote (an outline, a marker)
    text: str
    why: str  # head | tail | outline | listing | whole | omitted, or the salience reasons joined by '+'
    repeats: int = 1  # consecutive identical lines folded into this one
    through: int = 0  # the artifact line of the last of them

    def render(self) -> str:
        text = f"{self.text} [x{self.repeats}]" if self.repeats > 1 else self.text
        return f"L{self.number}: {text}" if self.number and self.why not in (
            "head", "tail", "whole", "outline", "listing", "omitted") else text


# Deterministic salience: the lines that carry a decision. Weights rank them when the budget is short.
_SALIENCE: tuple[tuple[str, int, re.Pattern[str]], ...] = (
    ("condition", 3, re.compile(
        r"\b(?:exceptions?|except|unless|only if|provided that|must|shall|never|requires?|required|"
        r"approvals?|approved|limits?|deadlines?|no later than|at least|at most|prohibited|forbidden|"
        r"not allowed|mandatory)\b", re.I)),
    ("negation", 2, re.compile(r"\b(?:not|cannot|never|none|no longer|neither|nor)\b|n't\b", re.I)),
    ("error", 2, re.compile(
        r"\b(?:errors?|exception|traceback|failed|failures?|fatal|panic|warnings?|denied|refused|invalid|"
        r"timed? ?out)\b", re.I)),
    ("status", 1, re.compile(r"^\W*(?:status|state|result|outcome|decision|resolution)\W*\s*[:=]", re.I)),
)
_POLICY_WEIGHT, _MENTIONED_WEIGHT = 4, 3
_MIN_WEIGHT = 2  # a status field alone does not earn a place
_TERM = re.compile(r"[A-Za-z0-9$][A-Za-z0-9_\-.,/:]*[A-Za-z0-9%]")
_CONTINUATION = re.compile(r"^(?:[a-z]|(?:and|or|but|unless|except|then|so)\b)")


_REMEMBERED_LINE_CHARS = 2048  # longer texts are not kept as keys of terms_of's cache


def terms_of(text: str) -> frozenset[str]:
    """Identifiers and amounts in `text`: tokens of 3 to 40 characters mixing digits with letters or
    punctuation (not paths), bare numbers of 4+ digits or with a currency sign. Remembered for short
    texts (lines come back on every request of a conversation); a long one is not held as a key."""
    return _remembered_terms(text) if len(text) <= _REMEMBERED_LINE_CHARS else _terms_of(text)


def _terms_of(text: str) -> frozenset[str]:
    out = set()
    for raw in _TERM.findall(text):
        token = raw.strip(".,:/").lstrip("$").replace(",", "")
        if "/" in token or len(token) > 40:
            continue  # paths and URLs: every output of a session echoes its working directory
        if token.isdigit():
            if len(token) >= 4 or raw.startswith("$"):  # small bare numbers are line numbers and counts
                out.add(token)
        elif len(token) >= 3 and any(ch.isdigit() for ch in token):
            out.add(token)
    return frozenset(out)


_remembered_terms = functools.lru_cache(maxsize=16384)(_terms_of)


@dataclass(frozen=True)
class Salience:
    """What makes a line worth keeping for one memory: built-in rules, the policy's patterns, and the
    identifiers and amounts the conversation had mentioned before the result."""

    patterns: tuple[str, ...] = ()
    terms: frozenset[str] = frozenset()

    def reasons(self, line: str) -> tuple[int, str, int]:
        """(weight, reasons joined by '+', where in the line the first reason starts)."""
        weight, why, at = 0, [], len(line)
        for pattern in self.patterns:
            if found := re.search(pattern, line):
                weight, why, at = weight + _POLICY_WEIGHT, [*why, "policy"], min(at, found.start())
                break
        for name, value, compiled in _SALIENCE:
            if found := compiled.search(line):
                weight, why, at = weight + value, [*why, name], min(at, found.start())
        if self.terms and (named := self.terms & terms_of(line)):
            weight, why = weight + _MENTIONED_WEIGHT, [*why, "mentioned"]
            at = min(at, min(line.find(term) for term in named))
        return weight, "+".join(why), at


def _window(line: str, at: int, width: int) -> str:
    """At most `width` characters of `line` around offset `at` (a third before it), cuts marked."""
    if len(line) <= width:
        return line
    start = max(0, min(at - width // 3, len(line) - width))
    return ("..." if start else "") + line[start:start + width] + ("..." if start + width < len(line) else "")


@dataclass
class _Line:
    number: int
    text: str
    repeats: int = 1
    last: int = 0  # the artifact line of the last repeat (blank lines between repeats are skipped)


def _folded_lines(text: str) -> list[_Line]:
    """Non-empty lines, spaces folded, runs of identical lines collapsed with a count."""
    out: list[_Line] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = " ".join(raw.split())
        if not line:
            continue
        if out and out[-1].text == line:
            out[-1].repeats += 1
            out[-1].last = number
        else:
            out.append(_Line(number, line, last=number))
    return out


def _take(lines: list[_Line], budget: int, limit: int) -> list[_Line]:
    """Lines from the front of `lines` until `budget` characters are used."""
    out: list[_Line] = []
    used = 0
    for line in lines:
        clipped = _clip(line.text, limit)
        if out and used + len(clipped) > budget:
            break
        out.append(line)
        used += len(clipped) + 1
        if used >= budget:
            break
    return out


def _salient(middle: list[_Line], salience: Salience, budget: int, limit: int,
             context: bool = True) -> dict[int, tuple[str, str]]:
    """Positions in `middle` worth keeping, with why and the text kept: the heaviest lines first, each
    cut to a window around what made it count, with the line before it where it reads as a
    continuation (`context`: lines of prose, not a JSON value's leaves, each whole in itself); the
    first line is kept even if the budget is smaller than it."""
    scored = []
    for position, line in enumerate(middle):
        weight, why, at = salience.reasons(line.text)
        if weight >= _MIN_WEIGHT:
            scored.append((-weight, position, why, at))
    chosen: dict[int, tuple[str, str]] = {}
    used = 0
    for _, position, why, at in sorted(scored):
        room = max(budget - used, 0)
        if chosen and room < 40:
            break
        text = _window(middle[position].text, at, limit if not chosen else min(limit, max(room, 60)))
        want = [(position, why, text)]
        previous = position - 1
        if context and previous >= 0 and previous not in chosen and _CONTINUATION.match(middle[position].text):
            context = middle[previous].text
            want.insert(0, (previous, "context", _window(context, len(context), min(limit, 60))))
        cost = sum(len(t) + 8 for p, _, t in want if p not in chosen)
        if chosen and used + cost > budget:
            continue
        for p, reason, t in want:
            chosen.setdefault(p, (reason, t))
        used += cost
    return chosen


def _text_excerpt(text: str, c: Compaction, salience: Salience = Salience(), window: int | None = None) -> list[Kept]:
    """The opening and the end of a text by character budget, and between them the lines that carry
    a decision (conditions, negations, errors, status fields, what the conversation mentioned), each
    with its line number; the gaps say which lines they leave out."""
    everything = _folded_lines(text)
    lines = [line for line in everything if not _is_noise(line.text)] or everything
    head = _take(lines, c.head_chars, c.max_line_chars)
    rest = lines[len(head):]
    tail = _take(rest[::-1], c.tail_chars, c.max_line_chars)[::-1] if rest else []
    middle = rest[: len(rest) - len(tail)]
    picked = _salient(middle, salience, c.salient_chars, window or c.max_line_chars) if middle else {}
    kept = [(line, "head", _clip(line.text, c.max_line_chars)) for line in head]
    kept += [(middle[p], why, shown) for p, (why, shown) in sorted(picked.items())]
    kept += [(line, "tail", _clip(line.text, c.max_line_chars)) for line in tail]
    out: list[Kept] = []
    last = 0  # the last artifact line covered so far
    total = text.count("\n") + 1
    for line, why, shown in kept:
        if out and line.number > last + 1 and _skipped(lines, last, line.number):
            out.append(Kept(0, f"[... lines {last + 1}-{line.number - 1} omitted ...]", "omitted"))
        out.append(Kept(line.number, shown, why, line.repeats, line.last))
        last = max(line.last, line.number)
    if kept and last < total and _skipped(lines, last, total + 1):
        out.append(Kept(0, f"[... lines {last + 1}-{total} omitted ...]", "omitted"))
    return out


def _skipped(lines: list[_Line], after: int, before: int) -> bool:
    """Whether any kept-worthy line lies strictly between artifact lines `after` and `before`."""
    return any(after < line.number < before for line in lines)


_BARE_KEY = re.compile(r"^[\w.\-]{1,40}$")
_BARE_VALUE = re.compile(r"^[\w@.+\-:/ ]{1,40}$")


def _json_outline(value: Any, depth: int, width: int) -> str:
    """A JSON value's shape and first values, short: simple keys and strings unquoted, nesting past
    two levels counted, lists shown by their first item."""
    if isinstance(value, dict):
        if depth >= 2:
            return f"{{{len(value)} keys}}"
        parts = [f"{k if _BARE_KEY.match(k) else json.dumps(k, ensure_ascii=False)}: "
                 f"{_json_outline(v, depth + 1, width)}" for k, v in list(value.items())[:16]]
        more = f", ...{len(value) - 16} more keys" if len(value) > 16 else ""
        return "{" + ", ".join(parts) + more + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        if depth >= 2:
            return f"[{len(value)} items]"
        first = _json_outline(value[0], depth + 1, width)
        return f"[{len(value)} items; first: {first}]" if len(value) > 1 else f"[{first}]"
    if isinstance(value, str) and _BARE_VALUE.match(value) and value == value.strip():
        return value
    rendered = json.dumps(value, ensure_ascii=False)
    return rendered if len(rendered) <= width else rendered[:width] + '..."'


def _fit(outline: str, budget: int, limit: int) -> str:
    """The outline cut after the last whole entry that fits `budget` characters (at least the first
    entry, up to `limit` characters), the cut marked."""
    if len(outline) <= budget:
        return outline
    cut = outline.rfind(", ", 0, max(budget - 5, 0))
    if cut <= 0:
        cut = outline.find(", ")
        if cut <= 0 or cut > limit:
            cut = outline.rfind(" ", 0, limit)
            if cut <= 0:
                return _clip(outline, limit)
    return outline[:cut] + ", ..."


def _json_excerpt(text: str, c: Compaction, salience: Salience = Salience(),
                  window: int | None = None) -> list[Kept] | None:
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    shown = _fit(_json_outline(value, 0, 60), c.head_chars + c.tail_chars, c.max_line_chars)
    out = [Kept(0, shown, "outline")]
    # the values the outline does not show already
    leaves = [_Line(0, f"{path}: {text}") for path, text in _json_leaves(value) if text not in shown]
    picked = _salient(leaves, salience, c.salient_chars, window or c.max_line_chars, context=False)
    return out + [Kept(0, shown, why) for _, (why, shown) in sorted(picked.items())]


_MAX_LEAVES = 5000


def _json_leaves(value: Any) -> list[tuple[str, str]]:
    """(path, text) of a JSON value's scalars, each line of a long string on its own: where the
    values that decide sit in an API's answer."""
    out: list[tuple[str, str]] = []
    stack: list[tuple[str, Any]] = [("", value)]
    while stack and len(out) < _MAX_LEAVES:
        path, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((f"{path}.{key}" if path else str(key), nested) for key, nested in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", nested) for i, nested in reversed(list(enumerate(item))))
        elif isinstance(item, str):
            out.extend((path, " ".join(line.split())) for line in item.split("\n") if line.strip())
        else:
            out.append((path, json.dumps(item)))
    return out


def _listing_excerpt(text: str, c: Compaction) -> list[Kept] | None:
    lines = [line for line in _folded_lines(text)]
    if len(lines) < 12 or sum(1 for line in lines if _PATH_LIKE.match(line.text)) < 0.8 * len(lines):
        return None
    dirs = sum(1 for line in lines if line.text.endswith("/") or line.text.startswith("d"))
    head = _take(lines, c.head_chars + c.tail_chars, c.max_line_chars)
    rest = len(lines) - len(head)
    summary = Kept(0, f"listing of {len(lines)} entries ({dirs} directories)", "listing")
    return [summary, *(Kept(line.number, _clip(line.text, c.max_line_chars), "head", line.repeats) for line in head)] + (
        [Kept(0, f"[... {rest} more entries ...]", "omitted")] if rest > 0 else [])


def _error_excerpt(text: str, c: Compaction, salience: Salience, window: int | None = None) -> list[Kept]:
    if len(text) <= c.error_max_chars:
        return [Kept(number, line, "whole") for number, line in enumerate(text.split("\n"), start=1)]
    return _text_excerpt(text, c, salience, window)


# terms_in by the result's sha256 (its content is a function of it): a cache keyed by the content
# itself held every result's text as long as the entry lived.
_TERMS_IN = BoundedCache(4096)


def _terms_in(content: str) -> frozenset[str]:
    found: set[str] = set()
    for line in _folded_lines(content):
        found |= terms_of(line.text)
    stripped = content.strip()
    if stripped[:1] in ("[", "{"):
        try:
            value = json.loads(stripped)
        except ValueError:
            value = None
        if value is not None:
            for path, text in _json_leaves(value):
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


def excerpt(view: ArtifactView, rule: ToolRule, c: Compaction, terms: frozenset[str] = frozenset()) -> list[Kept]:
    """The lines of the memory's body, by the rule's extractor, each with why it was kept."""
    kind = rule.extractor
    text = view.content
    window = c.max_line_chars  # a deciding line's window keeps its width whatever the result's size
    salience = Salience(patterns=(*c.salient_patterns, *rule.salient), terms=terms)
    c = budget_for(c, len(text))
    if kind == "error" or (kind == "auto" and view.status == "error"):
        return _error_excerpt(text, c, salience, window)
    if kind in ("json", "auto"):
        lines = _json_excerpt(text, c, salience, window)
        if lines is not None:
            return lines
    if kind in ("listing", "auto"):
        lines = _listing_excerpt(text, c)
        if lines is not None:
            return lines
    return _text_excerpt(text, c, salience, window)


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
    header = f"[compacted artifact:{view.artifact_id}; {view.tool_name or 'tool'} {view.status}; {_size_note(view)}; untrusted excerpt:]"
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
        f"[tool result withheld artifact:{view.artifact_id} | {view.tool_name or 'tool'}"
        f" | {view.status} | {reason}]"
    )


def _opening(text: str, limit: int, redactor: Redactor | None) -> str:
    """The first `limit` characters, redacted. A secret that starts before the cut and runs past it is
    still recognised: redaction looks a bounded way past the cut, far enough for any one-line secret."""
    if not redactor:
        return text[:limit]
    return redactor.redact(text[: limit + _LOOK_PAST]).text[:limit]


def _clip_redacted(line: str, limit: int, redactor: Redactor | None) -> str:
    """`_clip` of the line redacted (the same text as `_clip` when nothing is redacted)."""
    if not redactor:
        return _clip(line, limit)
    window = line[: limit + _LOOK_PAST]
    shown = redactor.redact(window).text
    unseen = len(line) - len(window)
    return _clip(shown, limit) if not unseen else f"{shown[:limit]}...[+{len(shown) - limit + unseen} chars]"


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
        return json.dumps({"compacted": f"artifact:{artifact_ref}", "chars": len(arguments), "head": head},
                          ensure_ascii=False)
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, str) and len(item) > min_chars:
            lines = item.split("\n")
            first = escape_untrusted(_clip_redacted(lines[0], 80, redactor))
            out[key] = f"[compacted: {len(item)} chars, {len(lines)} lines, starts {first!r}; exact: artifact:{artifact_ref}]"
        else:
            out[key] = item
    return json.dumps(out, ensure_ascii=False)
