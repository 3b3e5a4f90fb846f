"""Redaction: secrets and personal data in text replaced by a marker naming their kind.

Pure and deterministic: the same text under the same detectors always gives
the same bytes, so a memory redacted on one request is byte-identical on the
next and the provider's prefix cache keeps hitting. Redacting twice changes
nothing more than redacting once (the markers match no detector, and a pass
is repeated until nothing is left to find).

Every pattern is written so that a match can only start at a fixed literal or
at the start of a run of its characters, and no two of its parts can share a
character: the scan stays linear in the text, whatever the text. A detector
whose literals do not occur in the text is not run at all.

A replacement keeps the lines of what it replaces (a private key spanning ten
lines becomes the marker and nine empty lines), so line numbers in memories
and line ranges asked of the rehydration tool still point where they did.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

BUILTINS = ("api_keys", "bearer_tokens", "private_keys", "emails", "card_numbers")
# A secret glued to the end of another (`...e5sk-proj-...`) is found only once the one before it is a
# marker: each further pass settles one more link of such a chain. Passes stop when one changes
# nothing (usually the second); the bound only stops a tenant pattern that feeds on its own markers.
_PASSES = 64

Span = tuple[int, int]


def marker(kind: str) -> str:
    return f"[REDACTED:{kind}]"


@dataclass(frozen=True)
class Redacted:
    text: str
    counts: Mapping[str, int]  # kind -> how many were replaced, kinds in order


@dataclass(frozen=True)
class Detector:
    kind: str  # the name in the marker
    spans: Callable[[str], Iterator[Span]]  # sorted, non-overlapping
    needles: tuple[str, ...] = ()  # the detector runs only when one of these occurs
    lowered: bool = False  # needles are looked for in the lower-cased text


def pattern_spans(pattern: re.Pattern[str]) -> Callable[[str], Iterator[Span]]:
    """The matches of `pattern`, only its group `secret` where it has one (the context around a
    secret, such as `api_key=`, stays readable)."""
    group = "secret" if "secret" in pattern.groupindex else 0

    def spans(text: str) -> Iterator[Span]:
        for found in pattern.finditer(text):
            start, end = found.span(group)
            if end > start:  # an empty match, or a `secret` group that took no part
                yield start, end
    return spans


def _regex(kind: str, pattern: str, needles: tuple[str, ...] = (), lowered: bool = False) -> Detector:
    return Detector(kind, pattern_spans(re.compile(pattern)), needles, lowered)


_NOT_KEY = r"(?<![A-Za-z0-9_\-])"
_CONTEXT_VALUE = r"""["']?\s*[:=]\s*["']?"""
_API_KEYS = (
    # OpenAI (sk-..., sk-proj-..., sk-svcacct-...) and Anthropic (sk-ant-api03-...)
    _regex("api_key", _NOT_KEY + r"sk-[A-Za-z0-9_\-]{20,}", ("sk-",)),
    _regex("api_key", r"(?<![A-Z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])", ("AKIA", "ASIA")),
    _regex("api_key", r"(?i:\baws_?secret_?access_?key)" + _CONTEXT_VALUE
           + r"(?P<secret>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])", ("secret",), lowered=True),
    _regex("api_key", _NOT_KEY + r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
           ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")),
    _regex("api_key", _NOT_KEY + r"xox[abposr]-[A-Za-z0-9\-]{10,}", ("xox",)),
    _regex("api_key", _NOT_KEY + r"AIza[0-9A-Za-z_\-]{35}", ("AIza",)),
    _regex("api_key", r"(?i:\b(?:api[_\-]?(?:key|secret|token)|access[_\-]?token|auth[_\-]?token|client[_\-]?secret"
           r"|secret[_\-]?key))" + _CONTEXT_VALUE + r"(?P<secret>[A-Za-z0-9_\-./+=~]{8,})",
           ("key", "token", "secret"), lowered=True),
)
_BEARER_TOKENS = (
    _regex("bearer_token", r"(?i:\bauthorization)" + _CONTEXT_VALUE
           + r"(?i:bearer|basic|token)\s+(?P<secret>[A-Za-z0-9\-._~+/]+=*)", ("authorization",), lowered=True),
    _regex("bearer_token", r"(?i:\bbearer)\s+(?P<secret>[A-Za-z0-9\-._~+/]{16,}=*)", ("bearer",), lowered=True),
    _regex("bearer_token", _NOT_KEY + r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*", ("eyJ",)),
)

_PEM_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
# A key cut off before its END line: the lines after BEGIN made of base64 or of `Name: value` headers
# (real line breaks, or `\n` escapes inside a JSON string, whose closing quote ends the last line).
_PEM_REST = re.compile(r'(?:(?:\r?\n|(?:\\r)?\\n)(?:[ \t]*[A-Za-z0-9+/=]*[ \t]*|[A-Za-z\-]+:[^\n\\"]*)(?=\r?\n|\\|"|$))*')


def _private_keys(text: str) -> Iterator[Span]:
    position = 0
    no_end_after = len(text) + 1  # where a search for an END line found none (none follows later either)
    while (begin := _PEM_BEGIN.search(text, position)) is not None:
        end = _PEM_END.search(text, begin.end()) if begin.end() < no_end_after else None
        if end is None:
            no_end_after = min(no_end_after, begin.end())
            stop = _PEM_REST.match(text, begin.end()).end()  # type: ignore[union-attr]
        else:
            stop = end.end()
        yield begin.start(), stop
        position = stop


_EMAIL = re.compile(r"(?<![A-Za-z0-9._%+\-])[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}")

# Runs of 13 or more digits, single spaces or dashes allowed between them; a card is a stretch of
# whole groups of such a run with 13 to 19 digits that starts as card numbers do and passes Luhn.
# A run is the whole chain of digits and single separators: the greedy search never starts inside one
# (from inside, fewer digits are left than from its start), so it needs no look-behind, which made the
# search three times slower (`DIGIT_RUN_PLAIN`, the same matches: tests/policies/test_redaction.py).
DIGIT_RUN_PLAIN = r"(?<!\d)(?<!\d[ \-])\d(?:[ \-]?\d){12,}"
_DIGIT_RUN = re.compile(r"\d(?:[ \-]?\d){12,}")
_GROUP = re.compile(r"\d+")


def luhn_valid(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _card_numbers(text: str) -> Iterator[Span]:
    for run in _DIGIT_RUN.finditer(text):
        groups = [(g.start(), g.end()) for g in _GROUP.finditer(run.group())]
        i = 0
        while i < len(groups):
            found, digits = None, ""
            if run.group()[groups[i][0]] in "23456":  # Mastercard 2-series, Amex/Diners/JCB, Visa, MC, Discover
                for j in range(i, len(groups)):
                    digits += run.group()[groups[j][0]:groups[j][1]]
                    if len(digits) > 19:
                        break
                    if len(digits) >= 13 and luhn_valid(digits):
                        found = j  # the longest from here
            if found is None:
                i += 1
                continue
            yield run.start() + groups[i][0], run.start() + groups[found][1]
            i = found + 1


BUILTIN_DETECTORS: dict[str, tuple[Detector, ...]] = {
    "private_keys": (Detector("private_key", _private_keys, ("PRIVATE KEY",)),),
    "bearer_tokens": _BEARER_TOKENS,
    "api_keys": _API_KEYS,
    "emails": (Detector("email", pattern_spans(_EMAIL), ("@",)),),
    "card_numbers": (Detector("card_number", _card_numbers),),
}
_ORDER = ("private_keys", "bearer_tokens", "api_keys", "emails", "card_numbers")  # the widest first


def custom_detector(name: str, regex: str) -> Detector:
    return Detector(name, pattern_spans(re.compile(regex)))


def pattern_problem(name: str, regex: str, builtins: Iterable[str] = BUILTINS) -> str | None:
    """Why a tenant's pattern cannot be used (None: it can)."""
    try:
        compiled = re.compile(regex)
    except re.error as error:
        return f"{regex!r} is not a regular expression: {error}"
    except RecursionError:
        return f"{regex!r} is nested too deeply"
    if compiled.fullmatch(""):
        return f"{regex!r} matches the empty string"
    kinds = {name, *(d.kind for group in builtins for d in BUILTIN_DETECTORS.get(group, ()))}
    for kind in sorted(kinds):
        if compiled.search(marker(kind)):
            return f"{regex!r} matches the marker {marker(kind)!r} it would leave, so redacting would never settle"
    return None


class Redactor:
    """The detectors a policy turns on, applied in one fixed order."""

    def __init__(self, builtins: Iterable[str] = BUILTINS, patterns: Iterable[tuple[str, str]] = ()) -> None:
        chosen = set(builtins)
        self.detectors: tuple[Detector, ...] = (
            *(d for group in _ORDER if group in chosen for d in BUILTIN_DETECTORS[group]),
            *(custom_detector(name, regex) for name, regex in patterns),
        )

    def __bool__(self) -> bool:
        return bool(self.detectors)

    def find(self, text: str) -> list[tuple[str, Span]]:
        """What one pass would replace: (kind, span) of each detector's matches in `text` as it is."""
        haystacks = _Haystacks(text)
        return [(d.kind, span) for d in self.detectors if haystacks.may_hold(d) for span in d.spans(text)]

    def redact(self, text: str) -> Redacted:
        counts: dict[str, int] = {}
        for _ in range(_PASSES):
            changed = False
            haystacks = _Haystacks(text)
            for detector in self.detectors:
                if not haystacks.may_hold(detector):
                    continue
                text, replaced = _replace(detector, text)
                if replaced:
                    counts[detector.kind] = counts.get(detector.kind, 0) + replaced
                    haystacks, changed = _Haystacks(text), True
            if not changed:
                break
        return Redacted(text, counts)

    def redact_content(self, content: Any) -> Any:
        """A message's content redacted: a string, or the text of each of its parts."""
        if not self.detectors:
            return content
        if isinstance(content, str):
            return self.redact(content).text
        if isinstance(content, list):
            return [{**part, "text": self.redact(part["text"]).text}
                    if isinstance(part, Mapping) and isinstance(part.get("text"), str) else part for part in content]
        return content

    def redact_value(self, value: Any) -> tuple[Any, Mapping[str, int]]:
        """Every string in a JSON-like value redacted (keys kept), and the counts: structured content
        stays the structure it was, where redacting its serialised text could break an escape."""
        counts: dict[str, int] = {}

        def walk(item: Any) -> Any:
            if isinstance(item, str):
                found = self.redact(item)
                for kind, count in found.counts.items():
                    counts[kind] = counts.get(kind, 0) + count
                return found.text
            if isinstance(item, list):
                return [walk(member) for member in item]
            if isinstance(item, Mapping):
                return {key: walk(member) for key, member in item.items()}
            return item

        redacted = walk(value) if self.detectors else value
        return (redacted, counts) if counts else (value, counts)

    def redact_bytes(self, data: bytes) -> tuple[bytes, Mapping[str, int]]:
        """UTF-8 bytes redacted; the very same bytes when nothing was found."""
        try:
            text = data.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            text = data.decode("utf-8", "replace")
        found = self.redact(text)
        if not found.counts:
            return data, found.counts
        return found.text.encode("utf-8", "surrogatepass"), found.counts


class _Haystacks:
    """Where a detector's literals are looked for: the text, or its lower-cased form (made once)."""

    def __init__(self, text: str) -> None:
        self.text, self._lowered = text, None

    def may_hold(self, detector: Detector) -> bool:
        if not detector.needles:
            return True
        if detector.lowered:
            if self._lowered is None:
                self._lowered = self.text.lower()
            haystack = self._lowered
        else:
            haystack = self.text
        return any(needle in haystack for needle in detector.needles)


def _replace(detector: Detector, text: str) -> tuple[str, int]:
    """`text` with one detector's matches replaced, each by its marker and the line breaks it held."""
    parts, last, count = [], 0, 0
    label = marker(detector.kind)
    for start, end in detector.spans(text):
        if text.startswith(label, start) and end == start + len(label):
            continue  # what a pattern like `password=(?P<secret>\S+)` finds again once redacted
        parts += [text[last:start], label, "\n" * text.count("\n", start, end)]
        last, count = end, count + 1
    if not count:
        return text, 0
    parts.append(text[last:])
    return "".join(parts), count
