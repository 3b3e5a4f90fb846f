"""policies/excerpts.py: the shortcuts that make a large result's excerpt cheap keep exactly what
scoring every line one by one keeps (issue 33: a 30 MiB body of tool results took 15 s to project,
most of it scoring lines that carry nothing), except in a dense log, where each source of weight
offers its first and last lines and the line the user asked about is still found."""
from __future__ import annotations

import re
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from policies import excerpts
from policies.excerpts import (
    _MIN_WEIGHT,
    _NOT_LETTER,
    Line,
    Salience,
    _candidates,
    _finds,
    _first_and_last,
    _rfinds,
    _is_noise,
    _letters,
    salient_lines,
    text_excerpt,
)
from policies.policy import Compaction

_LETTER = re.compile(r"[^\W\d_]")
_WORDS = ["the", "build", "order", "ORD-1042", "1,042", "$1,200", "12%", "must", "not", "can't", "Error", "failed",
          "timed out", "no later than", "status:", "src/app.py", "v2.3.1", "x", "--", "::", "é", "Straße", "STRASSE",
          "50%", "ab%12", "$", "1abc", "a1", "A-7", "refund", "approved", "warning", "ok", "7", "2026-12-01", "/tmp/x1"]
_lines = st.lists(st.sampled_from(_WORDS), max_size=12).map(" ".join)


def _scored_one_by_one(middle: list[Line], salience: Salience) -> list[tuple[int, int, str, int]]:
    """Every line scored, as `salient_lines` did before it looked for candidates."""
    out = []
    for position, line in enumerate(middle):
        weight, why, at = salience.reasons(line.text)
        if weight >= _MIN_WEIGHT:
            out.append((-weight, position, why, at))
    return sorted(out)


@settings(max_examples=300, deadline=None)
@given(line=st.text(max_size=80) | st.text(st.characters(max_codepoint=127), max_size=80))
def test_letters_are_counted_as_before(line: str) -> None:
    assert _letters(line) == len(_NOT_LETTER.sub("", line)) == len(_LETTER.findall(line))


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(_lines, min_size=60, max_size=140),
       terms=st.sets(st.sampled_from(["1042", "ORD-1042", "1200", "v2.3.1", "A-7", "2026-12-01", "a1", "1abc"])),
       asked=st.sets(st.sampled_from(["1042", "v2.3.1", "7777"])),
       phrases=st.sets(st.sampled_from(["straße", "src/app.py", "order ord", "refund"])),
       patterns=st.lists(st.sampled_from([r"^ok", r"refund$", r"\bbuild\b"]), max_size=2))
def test_the_candidates_hold_every_line_that_weighs_enough(texts: list[str], terms: set[str], asked: set[str],
                                                           phrases: set[str], patterns: list[str]) -> None:
    salience = Salience(patterns=tuple(patterns), terms=frozenset(terms), asked=frozenset(asked),
                        phrases=frozenset(phrases))
    middle = [Line(n, text) for n, text in enumerate(texts, start=1)]
    candidates = set(_candidates(texts, salience))
    assert {position for _, position, _, _ in _scored_one_by_one(middle, salience)} <= candidates
    with patch("policies.excerpts._candidates", lambda texts, _: range(len(texts))):
        every_line_scored = salient_lines(middle, salience, 400, 120)
    assert salient_lines(middle, salience, 400, 120) == every_line_scored


def test_a_large_result_keeps_the_lines_it_kept_when_every_line_was_scored() -> None:
    """A few thousand lines, the deciding ones spread through: the same excerpt as scoring each line."""
    lines = [f"line {n}: copied file{n % 7}.txt to the cache" for n in range(4000)]
    lines[1234] = "ERROR: order ORD-1042 was not shipped"
    lines[2500] = "refund must be approved before 2026-12-01"
    lines[3999 - 20] = "status: done"
    text = "\n".join(lines)
    salience = Salience(terms=frozenset({"ORD-1042", "2026-12-01"}), asked=frozenset({"ORD-1042"}))
    kept = text_excerpt(text, Compaction(), salience)
    numbers = {k.number for k in kept if k.why not in ("head", "tail", "omitted", "blank")}
    assert {1235, 2501} <= numbers
    assert not _is_noise(lines[1234])


@settings(max_examples=300, deadline=None)
@given(positions=st.lists(st.integers(0, 60), max_size=80), dense=st.integers(1, 12))
def test_a_source_offers_its_first_and_last_lines(positions: list[int], dense: int) -> None:
    distinct = sorted(set(positions))
    expected = set(distinct) if len(distinct) <= dense else set(distinct[:dense]) | set(distinct[-dense:])
    with patch.object(excerpts, "DENSE_LINES", dense):
        assert _first_and_last(iter(sorted(positions)), iter(sorted(positions, reverse=True))) == expected


@settings(max_examples=300, deadline=None)
@given(haystack=st.text(alphabet="ab\n", max_size=40), needle=st.text(alphabet="ab", min_size=1, max_size=3))
def test_finds_are_every_occurrence_overlapping_ones_included(haystack: str, needle: str) -> None:
    every = [at for at in range(len(haystack)) if haystack.startswith(needle, at)]
    assert list(_finds(haystack, needle)) == every
    assert list(_rfinds(haystack, needle)) == every[::-1]


def test_in_a_dense_log_the_line_the_user_asked_about_is_still_kept() -> None:
    """400,000 lines that all say "error": what is scored is bounded, the asked line is still found."""
    lines = [f"error: build step {n} failed with warning W{n % 97:02d}" for n in range(400_000)]
    lines[211_337] = "error: shipment for order ORD-77813 went to the wrong depot"
    salience = Salience(terms=frozenset({"ORD-77813"}), asked=frozenset({"ORD-77813"}))
    candidates = _candidates(lines, salience)
    assert 211_337 in candidates and len(candidates) <= 2 * excerpts.DENSE_LINES + 1
    kept = text_excerpt("\n".join(lines), Compaction(), salience)
    assert any(k.number == 211_338 and "ORD-77813" in k.text and "asked" in k.why for k in kept)


def test_a_term_is_found_where_the_text_writes_it_with_commas() -> None:
    lines = ["copied a file"] * 100
    lines[60] = "the refund of $1,200,000 was approved"
    assert 60 in _candidates(lines, Salience(terms=frozenset({"1200000"}), asked=frozenset({"1200000"})))
