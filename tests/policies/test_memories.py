"""Memories that keep what decides: salient lines, their numbers, folded repeats, stable bytes."""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest

from policies.excerpts import Kept, Salience, terms_of
from policies.memories import ArtifactView, excerpt, render_memory
from policies.policy import Compaction, PolicyError, ToolRule, policy_from_mapping

RULE = ToolRule(match=["*"])
TIGHT = Compaction(head_chars=60, tail_chars=40, salient_chars=160)


def view(text: str, tool: str = "fetch_doc", status: str = "ok") -> ArtifactView:
    digest = hashlib.sha256(text.encode()).hexdigest()
    return ArtifactView(artifact_id="art_" + digest[:20], tool_name=tool, arguments="{}", status=status,
                        content=text, sha256=digest, tokens=len(text) // 4, observed_at=0.0)


def filler(start: int, count: int) -> list[str]:
    return [f"Section {i}: general terms about shipping and handling of parcels." for i in range(start, start + count)]


def test_an_exception_in_the_middle_is_kept_with_its_line_number() -> None:
    lines = ["Refund policy, revision 7"] + filler(1, 40)
    lines[23] = "Refunds over the limit require manager approval unless the order shipped late."
    kept = excerpt(view("\n".join(lines + ["End of document."])), RULE, TIGHT)
    salient = [k for k in kept if k.number == 24]
    assert salient and "require manager approval unless" in salient[0].text
    assert "condition" in salient[0].why
    rendered = render_memory(view("\n".join(lines)), RULE, TIGHT)
    assert "L24: Refunds over the limit require manager approval unless" in rendered
    assert "[lines 2-23 omitted]" in rendered  # the gaps say exactly which lines are left out


def test_a_negation_inside_a_long_note_is_kept_around_where_it_matters() -> None:
    note = ("Customer called twice about the subscription and the billing address; we reviewed the history of "
            "the account at length, and after discussion the decision is: do NOT cancel, only pause the plan "
            "until March, then review.")
    lines = filler(1, 30) + [note] + filler(31, 30)
    kept = excerpt(view("\n".join(lines)), RULE, Compaction(head_chars=60, tail_chars=40, salient_chars=80))
    (line,) = [k for k in kept if k.number == 31]
    assert "do NOT cancel, only pause" in line.text and line.text.startswith("...")  # a window, cut marked
    assert len(line.text) <= 160 + 6


def test_errors_and_mentioned_identifiers_rank_above_plain_lines() -> None:
    lines = filler(1, 20) + ["booking ZX81QF status: confirmed"] + filler(21, 20) + ["WARNING: disk nearly full"]
    lines += filler(41, 20)
    kept = excerpt(view("\n".join(lines)), RULE, TIGHT, terms=frozenset({"ZX81QF"}))
    whys = {k.number: k.why for k in kept}
    assert "mentioned" in whys[21] and "error" in whys[42]
    without = excerpt(view("\n".join(lines)), RULE, TIGHT)
    assert 21 not in {k.number for k in without}  # nobody named it: only its status field, not enough


def test_policy_patterns_add_salient_lines() -> None:
    lines = filler(1, 20) + ["Ticket escalated to tier 2"] + filler(21, 20)
    text = "\n".join(lines)
    assert 21 not in {k.number for k in excerpt(view(text), RULE, TIGHT)}
    rule = ToolRule(match=["*"], salient=[r"(?i)escalat"])
    (line,) = [k for k in excerpt(view(text), rule, TIGHT) if k.number == 21]
    assert line.why == "policy"
    everywhere = Compaction(head_chars=60, tail_chars=40, salient_chars=160, salient_patterns=[r"tier \d"])
    assert 21 in {k.number for k in excerpt(view(text), RULE, everywhere)}


def test_runs_of_identical_lines_fold_with_a_count() -> None:
    text = "\n".join(["building...", *["warning: unused variable x"] * 12, "done"])
    kept = excerpt(view(text), RULE, Compaction(head_chars=400, tail_chars=40))
    assert [k.render() for k in kept] == ["building...", "warning: unused variable x [x12]", "done"]


def test_memories_are_byte_stable_and_budgeted() -> None:
    lines = filler(1, 200)
    for i in range(10, 190, 7):
        lines[i] = f"Line {i}: must not ship before approval, error code E{i}"
    text = "\n".join(lines)
    first = render_memory(view(text), RULE, TIGHT)
    assert first == render_memory(view(text), RULE, TIGHT)
    salient = [k for k in excerpt(view(text), RULE, TIGHT) if k.why not in ("head", "tail", "omitted")]
    assert 1 <= len(salient) and sum(len(k.text) + 8 for k in salient) <= TIGHT.salient_chars + 8
    assert len(first) < len(text) / 10


def test_terms_are_identifiers_and_amounts_not_small_numbers_or_paths() -> None:
    found = terms_of("Refund $250 for order ORD-5521 placed 2024-05-01 at line 12, see /srv/app/v2/main.py "
                     "or ticket 48213; IMPORTANT")
    assert {"250", "ORD-5521", "2024-05-01", "48213"} <= found
    assert not {"12", "IMPORTANT"} & found and not any("/" in t for t in found)


def test_salience_reasons_name_every_rule_that_matched() -> None:
    weight, why, at = Salience(terms=frozenset({"A1B2"})).reasons("Error: order A1B2 must not ship")
    assert why == "condition+negation+error+mentioned" and weight >= 9 and at == 0


@pytest.mark.parametrize("raw, field", [
    ({"name": "x", "compaction": {"salient_patterns": ["(unclosed"]}}, "compaction.salient_patterns"),
    ({"name": "x", "tools": [{"match": "a", "salient": ["[z-a]"]}]}, "tools[0].salient"),
    ({"name": "x", "tools": [{"match": "a", "supersede_on": "arguments.ref", "revision_on": "ref"}]},
     "tools[0].revision_on"),
])
def test_bad_salience_and_revision_settings_name_their_field(raw: dict, field: str) -> None:
    with pytest.raises(PolicyError) as caught:
        policy_from_mapping(raw, "policy.yaml")
    assert caught.value.field == field


SMALL = Compaction(head_chars=100, tail_chars=60, salient_chars=80, excerpt_share=0.05)


def reservation(note: str = "economy, 2 passengers") -> str:
    return json.dumps({"reservation_id": "JG7FMM", "user_id": "omar_davis_3817", "origin": "MCO",
                       "destination": "CLT", "flight_type": "one_way", "cabin": "business",
                       "flights": [{"flight_number": "HAT028", "date": "2024-05-21", "price": 1544},
                                   {"flight_number": "HAT134", "date": "2024-05-21", "price": 801}],
                       "passengers": [{"first_name": "Omar", "last_name": "Davis", "dob": "1950-06-17"}],
                       "payment_history": [{"payment_id": "credit_card_4803681", "amount": 2345}],
                       "created_at": "2024-05-13T09:18:51", "total_baggages": 1, "insurance": "no",
                       "note": note})


def test_a_small_result_gets_a_memory_to_its_scale_that_still_names_it() -> None:
    text = reservation()
    memory = render_memory(view(text, tool="get_reservation_details"), RULE, SMALL)
    header, *body = memory.split("\n")
    digest = hashlib.sha256(text.encode()).hexdigest()
    # the header names the artifact, its size (no "1 lines" for a one-line result) and digest; its status
    # only when not ok (the call before it names the tool)
    assert header == (f"[compacted artifact:art_{digest[:10]}; "
                      f"{len(text) // 4} tokens, sha256 {digest[:10]}; untrusted excerpt:]")
    failed = render_memory(view(text, tool="get_reservation_details", status="error"), RULE, SMALL)
    assert failed.startswith(f"[compacted artifact:art_{digest[:10]} error; ")
    assert body[0] == f"<<<{digest[:4]}" and body[-1] == f">>>{digest[:4]}"
    assert len(memory) - len(header) < 0.15 * len(text)  # the excerpt is to the result's scale
    assert "reservation_id: JG7FMM, " in memory  # an outline cut after whole entries, not inside a value
    assert memory == render_memory(view(text, tool="get_reservation_details"), RULE, SMALL)  # byte-stable
    bigger = render_memory(view(text, tool="get_reservation_details"), RULE, TIGHT)
    assert len(memory) < len(bigger)  # without excerpt_share the same budgets keep more


def test_a_small_result_still_keeps_its_deciding_lines() -> None:
    text = reservation(note="Do NOT rebook: refund only with manager approval")
    kept = excerpt(view(text, tool="get_reservation_details"), RULE, SMALL)
    assert [(k.text, k.why) for k in kept if k.why != "outline"] == [
        ("note: Do NOT rebook: refund only with manager approval", "condition+negation")]  # whole, no filler
    named = excerpt(view(reservation(), tool="get_reservation_details"), RULE, SMALL, terms=frozenset({"HAT134"}))
    assert ("flights[1].flight_number: HAT134", "mentioned") in [(k.text, k.why) for k in named]
    lines = [f"Section {i}: " + "general terms about shipping and handling of parcels. " * 3 for i in range(40)]
    lines[23] = "Refunds over the limit require manager approval unless the order shipped late."
    text = "\n".join(lines)
    scaled = excerpt(view(text), RULE, Compaction(head_chars=100, tail_chars=60, salient_chars=80, excerpt_share=0.01))
    full = excerpt(view(text), RULE, Compaction(head_chars=100, tail_chars=60, salient_chars=80))
    assert sum(len(k.text) for k in scaled) < sum(len(k.text) for k in full)
    (line,) = [k for k in scaled if k.number == 24]  # with its line number, for a ranged rehydration
    assert "require manager approval unless" in line.text


def test_a_json_outline_is_short_and_keeps_odd_values_quoted() -> None:
    text = json.dumps({"id": "A1", "title": "Hello, world", "nested": {"deep": {"deeper": 1}}, "n": None})
    (outline,) = [k for k in excerpt(view(text), RULE, Compaction()) if k.why == "outline"]
    assert outline.text == '{id: A1, title: "Hello, world", nested: {deep: {1 keys}}, n: null}'


def test_curl_progress_meter_is_not_an_opening() -> None:
    text = ("  % Total    % Received % Xferd  Average Speed   Time    Time     Time  Current\n"
            "                                 Dload  Upload   Total   Spent    Left  Speed\n"
            "100   606    0   606    0     0   6865      0 --:--:-- --:--:-- --:--:--  7129\n"
            "<title>A Simple CGI Page</title>\n" + "\n".join(filler(1, 30)))
    kept = excerpt(view(text), RULE, Compaction(head_chars=40, tail_chars=40, salient_chars=0))
    assert kept[0].text == "[lines 1-3 omitted]"  # said, not shown
    assert kept[1].text == "<title>A Simple CGI Page</title>" and kept[1].number == 4


def test_boilerplate_never_fills_an_excerpt_when_a_distinctive_line_fits() -> None:
    """A page's doctype and bare tags, a shell's prompt, the harness's prompt lines and terminal control
    sequences open and end many outputs and say nothing of this one."""
    page = ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<title>Order tracking</title>\n" + "\n".join(filler(1, 40)) + "\n</body>\n</html>\n")
    kept = excerpt(view(page), RULE, Compaction(head_chars=40, tail_chars=30, salient_chars=0))
    assert kept[0].text == "[lines 1-4 omitted]"
    assert kept[1].text == "<title>Order tracking</title>" and kept[1].number == 5
    assert not any(k.text.startswith(("<!DOCTYPE", "<html", "</html", "</body", "<head", "<meta")) for k in kept)
    shell = ("\x1b[?2004h\n(Open file: /testbed/app.py)\n(Current directory: /testbed)\nbash-$ \n"
             "Traceback (most recent call last):\n" + "\n".join(filler(1, 30))
             + "\nValueError: bad input\n(Open file: n/a)\n(Current directory: /testbed)\nroot@box:/testbed# ")
    kept = excerpt(view(shell), RULE, Compaction(head_chars=40, tail_chars=30, salient_chars=0))
    shown = [k for k in kept if k.why != "omitted"]
    assert shown[0].text.startswith("Traceback") and shown[-1].text == "ValueError: bad input"
    assert kept[-1].text == f"[lines {shown[-1].number + 1}-{shown[-1].number + 3} omitted]"
    page = ('<!DOCTYPE html\n\tPUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"\n'
            '\t"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd"\n>\n<html xmlns="http://www.w3.org/1999/xhtml">\n'
            + "\n".join(filler(1, 20)) + "\nYou are 123 years old.</body></html>")
    kept = excerpt(view(page), RULE, Compaction(head_chars=40, tail_chars=30, salient_chars=0))
    assert kept[0].text == "[lines 1-5 omitted]" and kept[1].number == 6  # a doctype over several lines too
    only = "<html>\n<body>\n</body>\n</html>"  # nothing but boilerplate: kept as it is
    assert [k.text for k in excerpt(view(only), RULE, Compaction(head_chars=10, tail_chars=10))][0] == "<html>"


# -- properties -----------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

WORDS = ["ok", "must", "not", "error", "status:", "unless", "A1B2", "$250", "the", "order", "never", "line",
         "approval", "x" * 30, "  ", "", "Refund", "deadline", "warning", "4471"]
texts = st.lists(st.lists(st.sampled_from(WORDS), max_size=14).map(" ".join), min_size=0, max_size=80).map("\n".join)
budgets = st.builds(Compaction, head_chars=st.integers(0, 200), tail_chars=st.integers(0, 200),
                    salient_chars=st.integers(0, 300), max_line_chars=st.integers(20, 160),
                    excerpt_share=st.one_of(st.none(), st.floats(0.01, 1.0)))


def assert_exact_elision(kept: list, originals: list[str]) -> None:
    """A memory states exactly what it omits: read in order, its lines account for every line of the
    artifact once (a shown line at its number, its folded repeats through `through`, a blank line shown
    blank) and a marker names exactly the lines between them that it leaves out."""
    expected = 1
    for k in kept:
        if k.why in ("listing", "outline"):
            continue  # a summary line of the extractor's own (a listing's count), no line of the artifact
        if k.why == "omitted":
            span = k.text.removeprefix("[").split(" omitted")[0].removeprefix("lines ").removeprefix("line ")
            first, _, last = span.partition("-")
            assert int(first) == expected, (k, expected)
            expected = int(last or first) + 1
        elif k.why == "blank":
            assert not originals[expected - 1].strip()
            expected += 1
        else:
            assert k.number == expected, (k, expected)
            expected = max(k.number, k.through) + 1
    assert expected == len(originals) + 1 or not kept


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts, budgets, st.frozensets(st.sampled_from(["A1B2", "250", "4471"])),
       st.frozensets(st.sampled_from(["A1B2", "4471"])), st.frozensets(st.sampled_from(["order never", "refund"])))
def test_excerpts_are_faithful_ordered_and_bounded(text: str, c: Compaction, terms: frozenset[str],
                                                   asked: frozenset[str], phrases: frozenset[str]) -> None:
    asked = asked & terms  # what a user turn named is among what the conversation named
    kept = excerpt(view(text), RULE, c, terms, asked, phrases)
    assert kept == excerpt(view(text), RULE, c, terms, asked, phrases)  # deterministic
    originals = text.split("\n")
    numbers = [k.number for k in kept if k.number]
    assert numbers == sorted(set(numbers))  # each line once, in order
    for k in kept:
        if not k.number:
            continue
        folded = " ".join(originals[k.number - 1].split())
        core = k.text.removeprefix("...").removesuffix("...")
        core = core.split("...[+")[0]
        assert core and core in folded  # lifted text is the artifact's own, cut at most
        run = [" ".join(o.split()) for o in originals[k.number - 1:]]
        repeats = 0
        for line in run:
            if line == folded:
                repeats += 1
            elif line:
                break
        assert repeats == k.repeats  # folded repeats are that line again, blank lines aside
    if not any(k.why == "outline" for k in kept):
        assert_exact_elision(kept, originals)
    salient = [k for k in kept if k.why not in ("head", "tail", "omitted", "whole", "outline", "listing", "blank")]
    assert sum(len(k.text) + 8 for k in salient) <= max(c.salient_chars, 0) + 2 * (c.max_line_chars + 14)


def test_a_listing_names_exactly_the_entries_it_leaves_out() -> None:
    names = [f"src/module_{i:03d}.py" for i in range(120)]
    names[40:40] = ["", ""]  # blank lines in a listing are lines too
    kept = excerpt(view("\n".join(names)), RULE, Compaction(head_chars=60, tail_chars=40))
    assert kept[0] == Kept(0, "listing of 120 entries (0 directories)", "listing")
    assert [k.text for k in kept[1:]][-1] == f"[lines {kept[-2].number + 1}-122 omitted]"
    assert_exact_elision(kept, "\n".join(names).split("\n"))


_keys = st.text("abcdefghij_", min_size=1, max_size=10)
_scalars = st.one_of(st.integers(-10**6, 10**6), st.text("abcxyz", min_size=1, max_size=20), st.booleans())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.dictionaries(_keys, _scalars, min_size=1, max_size=40), st.lists(_scalars, min_size=2, max_size=40)),
       budgets)
def test_a_json_outline_counts_exactly_what_it_leaves_out_at_the_top(value: Any, c: Compaction) -> None:
    text = json.dumps(value)
    (outline,) = [k.text for k in excerpt(view(text), ToolRule(match=["*"], extractor="json"), c) if k.why == "outline"]
    more = re.search(r", \.\.\.\+(\d+)[}\]]$", outline)
    body = outline[:more.start()] if more else outline[:-1]
    body = body.removeprefix("{") if isinstance(value, dict) else body.removeprefix(f"[{len(value)} items: ")
    entries = body.split(", ")
    assert len(entries) + (int(more.group(1)) if more else 0) == len(value)  # shown + counted = all of them
    expected = [f"{k}: {json.dumps(v) if not isinstance(v, str) else v}" for k, v in value.items()] \
        if isinstance(value, dict) else [json.dumps(v) if not isinstance(v, str) else v for v in value]
    assert [e.split("...[+")[0] for e in entries] == [e[:len(s.split("...[+")[0])] for e, s in zip(expected, entries)]
