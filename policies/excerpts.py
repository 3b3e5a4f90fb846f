"""Which lines of a tool result's text a memory keeps, and why: the opening and the end by character
budget, and between them the lines that carry a decision (conditions, negations, errors, status fields,
the policy's patterns, identifiers and amounts the conversation had named), each cut to a window
around what made it count; a listing as its count and first entries; a short error whole.

Pure functions of the text and the compaction settings, so a memory renders to the same bytes every
time (policies/memories.py renders them; policies/json_excerpt.py does the same for JSON values).
"""
from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from typing import Callable, Iterator

from policies.memo import memo
from policies.policy import Compaction

_PATH_LIKE = re.compile(r"^[\w.\-~/]+/?$|^[dl-][rwx\-]{9}\s")


def clip(line: str, limit: int) -> str:
    if len(line) <= limit:
        return line
    return f"{line[:limit]}...[+{len(line) - limit} chars]"


_NOT_LETTER = re.compile(r"[\W\d_]")  # the complement of a letter: what is left after removing these is letters


_PROGRESS_HEADER = re.compile(r"^% Total\s+% Received|^Dload\s+Upload\s+Total")  # curl's progress meter


# Boilerplate: lines any output of its kind opens or ends with, which say nothing of this one: a page's
# doctype (its public identifier and DTD on lines of their own too) and bare structural tags, a shell's
# prompt and the agent harness's prompt lines (SWE-agent's open file and directory), terminal control
# sequences, an output wrapper's bare tags.
_BOILERPLATE = re.compile(
    r"^(?:<!doctype\b[^>]*>?|</?(?:html|head|body|meta|link|title|script|style|output)\b[^>]*>"
    r"|PUBLIC\s+\"-//[^\"]*\"(?:\s+\"[^\"]*\")?\s*>?|\"https?://www\.w3\.org/[^\"]*\"\s*>?|/?>"
    r"|\S*(?:bash|sh|zsh)-?[\d.]*\$|[\w.\-]+@[\w.\-]+:\S*\s*[$#]"
    r"|\((?:open file|current directory): [^)]*\)|(?:\x1b\[[0-9;?]*[A-Za-z])+)\s*$",
    re.IGNORECASE)


def _is_noise(line: str) -> bool:
    """Lines no excerpt should spend its room on when a distinctive one fits: progress bars, rulers and
    tables of numbers (lines with almost no words), and boilerplate (`_BOILERPLATE`)."""
    return (len(line) >= 12 and _letters(line) < 0.25 * len(line)
            or bool(_PROGRESS_HEADER.match(line)) or bool(_BOILERPLATE.match(line)))


_ASCII_NOT_LETTERS = bytes(b for b in range(128) if not chr(b).isalpha())


def _letters(line: str) -> int:
    """How many letters `line` holds (an ASCII line's counted by deleting the other bytes: a few times
    faster than the regular expression every line of a large result went through)."""
    if line.isascii():
        return len(line.encode("ascii").translate(None, _ASCII_NOT_LETTERS))
    return len(_NOT_LETTER.sub("", line))


@dataclass(frozen=True)
class Kept:
    """One line of a memory's excerpt: where it was in the artifact and why it was kept."""

    number: int  # 1-based line of the artifact; 0 for a line the extractor wrote (an outline, a marker)
    text: str
    why: str  # head | tail | outline | listing | whole | omitted | blank, or the salience reasons joined by '+'
    repeats: int = 1  # consecutive identical lines folded into this one
    through: int = 0  # the artifact line of the last of them

    def render(self) -> str:
        text = f"{self.text} [x{self.repeats}]" if self.repeats > 1 else self.text
        return f"L{self.number}: {text}" if self.number and self.why not in (
            "head", "tail", "whole", "outline", "listing", "omitted", "blank") else text


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
# What a user turn asked about outweighs any one rule: it is the line the model is looking for.
_ASKED_WEIGHT, _POLICY_WEIGHT, _MENTIONED_WEIGHT = 6, 4, 3
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
        token = _term(raw)
        if token is not None:
            out.add(token)
    return frozenset(out)


def _term(raw: str) -> str | None:
    """The identifier or amount a `_TERM` match stands for, or None."""
    token = raw.strip(".,:/").lstrip("$").replace(",", "")
    if "/" in token or len(token) > 40:
        return None  # paths and URLs: every output of a session echoes its working directory
    if token.isdigit():
        return token if len(token) >= 4 or raw.startswith("$") else None  # small bare numbers: line numbers, counts
    return token if len(token) >= 3 and any(ch.isdigit() for ch in token) else None


_remembered_terms = memo(maxsize=16384)(_terms_of)

_QUOTED = re.compile(r"\"([^\"\n]{3,60})\"|(?<![\w'])'([^'\n]{3,60})'(?![\w'])|`([^`\n]{3,60})`"
                     r"|\u201c([^\u201d\n]{3,60})\u201d")
_USER_PATH = re.compile(r"(?<![\w/.:-])(?:~|\.{1,2})?/?(?:[\w.-]+/)+[\w.-]*\w")


PHRASES_PER_TEXT = 16  # a text naming more (a pasted listing) names nothing in particular past these


def phrases_of(text: str) -> tuple[str, ...]:
    """What a user's words name that `terms_of` does not: quoted terms (straight, typographic or code
    quotes), then paths with a directory (`src/app.py`, `/var/log/ship.log`), casefolded, in order, each
    once, at most `PHRASES_PER_TEXT`. URLs are not paths here, and a bare directory of one part
    (`/testbed`) names too much to single a line out."""
    out: dict[str, None] = {}
    for match in _QUOTED.finditer(text):
        if len(out) >= PHRASES_PER_TEXT:
            return tuple(out)
        quoted = next(g for g in match.groups() if g).strip()
        if len(quoted) >= 3:
            out.setdefault(quoted.casefold())
    for match in _USER_PATH.finditer(text):
        if len(out) >= PHRASES_PER_TEXT:
            break
        path = match.group(0)
        if path.strip("/").count("/") >= 1 and not path.startswith("//"):
            out.setdefault(path.casefold())
    return tuple(out)


@dataclass(frozen=True)
class Salience:
    """What makes a line worth keeping for one memory: what a user turn asked about (its identifiers,
    amounts, quoted terms and paths), built-in rules, the policy's patterns, and the identifiers and
    amounts calls named."""

    patterns: tuple[str, ...] = ()
    terms: frozenset[str] = frozenset()  # named by user turns or call arguments
    asked: frozenset[str] = frozenset()  # those of `terms` a user turn named
    phrases: frozenset[str] = frozenset()  # quoted terms and paths a user turn named, casefolded

    def reasons(self, line: str) -> tuple[int, str, int]:
        """(weight, reasons joined by '+', where in the line the first reason starts)."""
        weight, why, at = 0, [], len(line)
        if self.asked or self.phrases:
            folded = line.casefold()
            hits = [found for phrase in self.phrases if (found := folded.find(phrase)) >= 0]
            hits += [line.find(term) for term in self.asked & terms_of(line)]
            if hits:
                weight, why, at = _ASKED_WEIGHT, ["asked"], min(hits)
        for pattern in self.patterns:
            if found := re.search(pattern, line):
                weight, why, at = weight + _POLICY_WEIGHT, [*why, "policy"], min(at, found.start())
                break
        for name, value, compiled in _SALIENCE:
            if found := compiled.search(line):
                weight, why, at = weight + value, [*why, name], min(at, found.start())
        if not why[:1] == ["asked"] and self.terms and (named := self.terms & terms_of(line)):
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
class Line:
    number: int
    text: str
    repeats: int = 1
    last: int = 0  # the artifact line of the last repeat (blank lines between repeats are skipped)


def folded_lines(text: str) -> list[Line]:
    """Non-empty lines, spaces folded, runs of identical lines collapsed with a count."""
    out: list[Line] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = " ".join(raw.split())
        if not line:
            continue
        if out and out[-1].text == line:
            out[-1].repeats += 1
            out[-1].last = number
        else:
            out.append(Line(number, line, last=number))
    return out


def _take(lines: list[Line], budget: int, limit: int) -> list[Line]:
    """Lines from the front of `lines` until `budget` characters are used."""
    out: list[Line] = []
    used = 0
    for line in lines:
        clipped = clip(line.text, limit)
        if out and used + len(clipped) > budget:
            break
        out.append(line)
        used += len(clipped) + 1
        if used >= budget:
            break
    return out


# The built-in rules that earn a line a place alone (`_MIN_WEIGHT`), as one search that, once one of
# them is found, takes the rest of its line: none of them can match across a line's end (their spaces
# are literal), so searched for in a whole text they find the lines one search per line finds, each once.
_WEIGHTY = re.compile("(?:" + "|".join(compiled.pattern for _, value, compiled in _SALIENCE if value >= _MIN_WEIGHT)
                      + ")[^\n]*", re.I)
_SCAN_FROM_LINES = 64  # fewer lines are scored one by one
DENSE_LINES = 500  # a source of weight on over twice this many lines ("error" on all): its first and last scored


def _first_and_last(forward: Iterator[int], backward: Iterator[int]) -> set[int]:
    """The first `DENSE_LINES` distinct positions of `forward` (ascending), and if it holds more, the
    last `DENSE_LINES` of `backward` (the same positions, descending): stops reading both once it has them."""
    front: list[int] = []
    for position in forward:
        if not front or position != front[-1]:
            front.append(position)
            if len(front) > DENSE_LINES:
                break
    else:
        return set(front)
    chosen, last = set(front[:DENSE_LINES]), set()
    for position in backward:
        if position < front[DENSE_LINES] or len(last) == DENSE_LINES and position not in last:
            break
        last.add(position)
    return chosen | last


def _lines_where(texts: list[str], holds: Callable[[str], object]) -> set[int]:
    """`_first_and_last` of the positions of `texts` where `holds(text)`, tested one by one from each end."""
    return _first_and_last((p for p, text in enumerate(texts) if holds(text)),
                           (p for p in range(len(texts) - 1, -1, -1) if holds(texts[p])))


class _Joined:
    """A result's lines joined by line breaks, and the line each offset of it falls in."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.text = "\n".join(texts)
        self.starts = list(accumulate((len(text) + 1 for text in texts[:-1]), initial=0))

    def line_of(self, offset: int) -> int:
        return bisect_right(self.starts, offset) - 1

    @cached_property
    def _casefolded(self) -> str | None:
        """The joined text casefolded, or None where a character folds to several (offsets would shift)."""
        folded = self.text.casefold()
        return folded if len(folded) == len(self.text) else None

    @cached_property
    def _without_commas(self) -> _Joined:
        return self if "," not in self.text else _Joined(self.text.replace(",", "").split("\n"))

    def ruled(self) -> set[int]:
        """The lines a built-in rule weighs (`_WEIGHTY`)."""
        return _first_and_last((self.line_of(found.start()) for found in _WEIGHTY.finditer(self.text)),
                               (p for p in range(len(self.texts) - 1, -1, -1) if _WEIGHTY.search(self.texts[p])))

    def holding(self, needle: str, folded: bool = False) -> set[int]:
        """The lines that hold `needle` (casefolded lines with `folded`) as a substring."""
        haystack = self._casefolded if folded else self.text
        if haystack is None:
            return _lines_where(self.texts, lambda text: needle in text.casefold())
        return _first_and_last(map(self.line_of, _finds(haystack, needle)),
                               map(self.line_of, _rfinds(haystack, needle)))

    def term_lines(self, terms: frozenset[str]) -> set[int]:
        """The lines where a `_TERM` match may stand for one of `terms` (sought without commas: `_term` drops them)."""
        return set().union(*(self._without_commas.holding(term) for term in terms))


def _finds(haystack: str, needle: str) -> Iterator[int]:
    at = haystack.find(needle)
    while at >= 0:
        yield at
        at = haystack.find(needle, at + 1)


def _rfinds(haystack: str, needle: str) -> Iterator[int]:
    at = haystack.rfind(needle)
    while at >= 0:
        yield at
        at = haystack.rfind(needle, 0, at + len(needle) - 1) if at else -1


def _candidates(texts: list[str], salience: Salience) -> list[int] | range:
    """The positions of `texts` that may weigh `_MIN_WEIGHT` or more under `salience`: the lines that
    one of its sources of weight (`Salience.reasons`) can reach, found in the joined text by one search
    per source instead of one per line, since a line of a large result with none of them (most of
    them) weighs at most a status field's 1. Each candidate is scored as before, so the lines kept are
    the lines scoring every one keeps (tests/policies/test_excerpts.py checks it against scoring every
    line), except where one source reaches more than 2 x `DENSE_LINES` lines: then it offers its first
    and last `DENSE_LINES`, so a log of 400,000 lines that all say "error" costs what 1,000 cost, and
    the one line there that names what the user asked about is still found."""
    if len(texts) < _SCAN_FROM_LINES:
        return range(len(texts))
    joined = _Joined(texts)
    hit = joined.ruled()
    hit |= joined.term_lines(salience.asked)
    hit |= joined.term_lines(salience.terms - salience.asked)
    for phrase in salience.phrases:
        hit |= joined.holding(phrase, folded=True)
    for pattern in salience.patterns:
        hit |= _lines_where(texts, lambda text, pattern=pattern: re.search(pattern, text))
    return sorted(hit)


def salient_lines(middle: list[Line], salience: Salience, budget: int, limit: int,
             context: bool = True) -> dict[int, tuple[str, str]]:
    """Positions in `middle` worth keeping, with why and the text kept: the heaviest lines first, each
    cut to a window around what made it count, with the line before it where it reads as a
    continuation (`context`: lines of prose, not a JSON value's leaves, each whole in itself); the
    first line is kept even if the budget is smaller than it."""
    scored = []
    for position in _candidates([line.text for line in middle], salience):
        weight, why, at = salience.reasons(middle[position].text)
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


def text_excerpt(text: str, c: Compaction, salience: Salience = Salience(), window: int | None = None,
                 folded: list[Line] | None = None) -> list[Kept]:
    """The opening and the end of a text by character budget, and between them the lines that carry
    a decision (conditions, negations, errors, status fields, what the conversation mentioned), each
    with its line number; the gaps say which lines they leave out. `folded`: `folded_lines(text)`, when
    the caller has them."""
    everything = folded_lines(text) if folded is None else folded
    lines = [line for line in everything if not _is_noise(line.text)] or everything
    head = _take(lines, c.head_chars, c.max_line_chars)
    rest = lines[len(head):]
    tail = _take(rest[::-1], c.tail_chars, c.max_line_chars)[::-1] if rest else []
    middle = rest[: len(rest) - len(tail)]
    picked = salient_lines(middle, salience, c.salient_chars, window or c.max_line_chars) if middle else {}
    kept = [(line, "head", clip(line.text, c.max_line_chars)) for line in head]
    kept += [(middle[p], why, shown) for p, (why, shown) in sorted(picked.items())]
    kept += [(line, "tail", clip(line.text, c.max_line_chars)) for line in tail]
    out: list[Kept] = []
    last = 0  # the last artifact line covered so far
    raw = text.split("\n")
    for line, why, shown in kept:
        out += _gap(raw, last, line.number)
        out.append(Kept(line.number, shown, why, line.repeats, line.last))
        last = max(line.last, line.number)
    return out + _gap(raw, last, len(raw) + 1) if kept else out


_BLANK_SHOWN = 2  # a gap of at most this many blank lines is shown as blank lines, not named


def _gap(raw: list[str], after: int, before: int) -> list[Kept]:
    """What stands for the artifact lines strictly between `after` and `before` that the excerpt leaves out:
    nothing when there are none, as many blank lines when they are a few blank ones, else a marker naming
    them. Every line left out is accounted for, so the memory states exactly what it omits."""
    if before <= after + 1:
        return []
    missing = range(after + 1, before)
    if len(missing) <= _BLANK_SHOWN and all(not raw[n - 1].strip() for n in missing):
        return [Kept(0, "", "blank") for _ in missing]
    first, last = missing[0], missing[-1]
    return [Kept(0, f"[line {first} omitted]" if first == last else f"[lines {first}-{last} omitted]", "omitted")]


def listing_excerpt(text: str, c: Compaction, folded: list[Line] | None = None) -> list[Kept] | None:
    """A listing (four lines in five path-like) as its count and its first entries; None for any other
    text, known as soon as more than a fifth of its lines are not path-like. `folded`: `folded_lines(text)`."""
    lines = folded_lines(text) if folded is None else folded
    if len(lines) < 12:
        return None
    path_like, needed = len(lines), 0.8 * len(lines)  # counted down: each other line takes one off
    for line in lines:
        if not _PATH_LIKE.match(line.text):
            path_like -= 1
            if path_like < needed:
                return None
    dirs = sum(1 for line in lines if line.text.endswith("/") or line.text.startswith("d"))
    head = _take(lines, c.head_chars + c.tail_chars, c.max_line_chars)
    out = [Kept(0, f"listing of {len(lines)} entries ({dirs} directories)", "listing")]
    raw, last = text.split("\n"), 0
    for line in head:  # the first entries, then the lines left out named exactly
        out += _gap(raw, last, line.number)
        out.append(Kept(line.number, clip(line.text, c.max_line_chars), "head", line.repeats, line.last))
        last = max(line.last, line.number)
    return out + _gap(raw, last, len(raw) + 1)


def error_excerpt(text: str, c: Compaction, salience: Salience, window: int | None = None) -> list[Kept]:
    if len(text) <= c.error_max_chars:
        return [Kept(number, line, "whole") for number, line in enumerate(text.split("\n"), start=1)]
    return text_excerpt(text, c, salience, window)
