"""Memories that follow the question (issue 32): the line that answers what a user turn asks about reaches
the model inside the memory of a long, otherwise unremarkable output, whether the question came before the
output was compacted or after; the memory then stays the same bytes on every later request, a question
that names nothing hidden changes no memory, and the policy can turn it all off."""
from __future__ import annotations

import json
import random
from typing import Any

from policies.excerpts import phrases_of
from policies.presets import preset
from policies.policy import Policy, policy_from_mapping
from tests.policies.test_assembler import project, tool_round

CITIES = ["Rotterdam", "Lyon", "Hamburg", "Milan", "Porto", "Gdansk"]
CARRIERS = ["DHL", "DSV", "Kuehne", "GEODIS"]
ASKED_ROW = 137  # 0-based: artifact line 138


def shipment_log(rows: int = 260, seed: int = 7) -> list[str]:
    """A week's shipment log: every row alike in form, none with an error, a negation or a condition."""
    rng = random.Random(seed)
    orders = rng.sample(range(50000, 59999), rows)
    return [f"2026-11-{1 + i // 12:02d} {8 + i % 10:02d}:{(i * 7) % 60:02d} SHP-{1000 + i} ORD-{orders[i]} "
            f"{rng.choice(CITIES)}->{rng.choice(CITIES)} pallets={1 + i % 6} carrier={rng.choice(CARRIERS)} "
            f"eta=2026-11-{10 + i % 15}" for i in range(rows)]


ROWS = shipment_log()
ORDER = ROWS[ASKED_ROW].split()[3]


def desk(log: list[str] = ROWS, ask_first: str | None = None) -> list[dict[str, Any]]:
    """The logistics desk: the log is pulled, then other work goes on for a few rounds."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are the logistics desk assistant."},
                                      {"role": "user", "content": ask_first or "Pull this week's shipment log."}]
    messages += tool_round("c1", "get_shipment_log", "\n".join(log), week="2026-W45")
    messages += [{"role": "assistant", "content": f"The log has {len(log)} shipments this week."},
                 {"role": "user", "content": "Check the warehouse capacity in Lyon."}]
    for k in range(4):
        messages += tool_round(f"w{k}", "warehouse_capacity", json.dumps({"site": "Lyon", "free": 100 + k}),
                               site="Lyon")
    return messages + [{"role": "assistant", "content": "Lyon has room."}]


def ask(question: str) -> dict[str, Any]:
    return {"role": "user", "content": question}


def log_memory(messages: list[dict[str, Any]], pol: Policy) -> str:
    projection, _ = project(messages, pol)
    assert projection.decisions[3].action == "compacted", projection.decisions[3]
    return projection.messages[3]["content"]


def coding_agent(**compaction: Any) -> Policy:
    raw = json.loads(json.dumps({"name": "ca", "version": 1, "compaction": {
        "keep_recent_rounds": 1, "trigger_tokens": 0, "clear_at_least_tokens": 0, "min_tokens": 200,
        "argument_min_tokens": 120, "head_chars": 100, "tail_chars": 60, "salient_chars": 80,
        "excerpt_share": 0.05, "horizon": 3.0, **compaction}}))
    return policy_from_mapping(raw, "<test>")


def test_the_asked_for_row_of_a_long_log_reaches_the_model_in_its_memory() -> None:
    messages = desk()
    before = log_memory(messages, preset("coding-agent"))
    assert ORDER not in before  # nothing about the row looks salient
    question = messages + [ask(f"Which carrier has order {ORDER}, and when does it arrive?")]
    after = log_memory(question, preset("coding-agent"))
    assert f"L{ASKED_ROW + 1}: {ROWS[ASKED_ROW]}" in after
    assert f"[lines 2-{ASKED_ROW} omitted]" in after and f"[lines {ASKED_ROW + 2}-259 omitted]" in after
    projection, _ = project(question, preset("coding-agent"))
    kept = projection.decisions[3].kept
    assert f"{ASKED_ROW + 1} asked" in kept, kept


def test_once_it_follows_the_question_the_memory_stays_the_same_bytes() -> None:
    messages = desk() + [ask(f"Which carrier has order {ORDER}, and when does it arrive?")]
    asked = log_memory(messages, preset("coding-agent"))
    later = messages
    for k in range(4):  # the agent works on: a lookup of the order, then other calls and another question
        later = later + tool_round(f"t{k}", "track_order", json.dumps({"order": ORDER, "scan": k}), order=ORDER)
        assert log_memory(later, preset("coding-agent")) == asked
    later = later + [{"role": "assistant", "content": "It is with the carrier."}, ask("Thanks. Anything late?")]
    assert log_memory(later, preset("coding-agent")) == asked


def test_a_question_that_names_nothing_hidden_changes_no_memory() -> None:
    messages = desk()
    before, _ = project(messages, preset("coding-agent"))
    for question in ("How many shipments went to Lyon?", f"Tell me about {ROWS[0].split()[3]}.",
                     "Any update from the warehouse?"):
        after, _ = project(messages + [ask(question)], preset("coding-agent"))
        assert after.messages[:len(messages)] == before.messages, question  # the whole prefix, byte for byte


def test_a_question_asked_before_the_output_is_compacted_shapes_its_memory_from_the_start() -> None:
    messages = desk(ask_first=f"Pull this week's shipment log and find order {ORDER}.")
    memory = log_memory(messages, preset("coding-agent"))
    assert f"L{ASKED_ROW + 1}: {ROWS[ASKED_ROW]}" in memory
    assert log_memory(messages + [ask("And the warehouse?")], preset("coding-agent")) == memory


def test_quoted_terms_and_paths_are_asked_about_too() -> None:
    rows = list(ROWS)
    rows[ASKED_ROW] = rows[ASKED_ROW].replace("pallets=", "consignee=BLUE HARBOR FOODS pallets=")
    rows[60] = rows[60].replace("pallets=", "manifest=/srv/manifests/w45/lyon-0412.pdf pallets=")
    messages = desk(rows)
    quoted = log_memory(messages + [ask('Where is the "Blue Harbor Foods" shipment?')], preset("coding-agent"))
    assert f"L{ASKED_ROW + 1}: " in quoted and "BLUE HARBOR FOODS" in quoted
    path = log_memory(messages + [ask("Which shipment has /srv/manifests/w45/lyon-0412.pdf?")], preset("coding-agent"))
    assert "L61: " in path and "lyon-0412.pdf" in path
    assert phrases_of("see `make test`, 'Blue Harbor', “Nord Sud”, src/app.py, https://x.io/a/b, /testbed") == (
        "make test", "blue harbor", "nord sud", "src/app.py")
    many = " ".join(f"dir/file{i}.py" for i in range(1000))  # a pasted listing: a bounded few, in order
    assert phrases_of(many) == tuple(f"dir/file{i}.py" for i in range(16))


def test_the_policy_can_turn_it_off() -> None:
    messages = desk(ask_first=f"Find order {ORDER}.") + [ask(f"Which carrier has order {ORDER}?")]
    assert ORDER in log_memory(messages, coding_agent())
    assert ORDER not in log_memory(messages, coding_agent(follow_conversation=False))


def test_a_clients_own_reminders_ask_nothing() -> None:
    messages = desk() + [{"role": "user", "content": [
        {"type": "text", "text": f"<system-reminder>The user opened a file mentioning {ORDER}.</system-reminder>"},
        {"type": "text", "text": "Go on."}]}]
    assert ORDER not in log_memory(messages, preset("coding-agent"))


def test_a_question_right_after_the_move_that_compacted_the_log_is_followed() -> None:
    # The request that moves the boundary renders the log as of the latest round; a question asked at the
    # same round count (the model answered in prose) re-renders it, and the next round keeps those bytes.
    messages = desk()[:8]  # the log's round, then one more: this request's move compacts the log now
    moved = log_memory(messages, preset("coding-agent"))
    assert ORDER not in moved
    asked = messages + [{"role": "assistant", "content": "Lyon has room."},
                        ask(f"Which carrier has order {ORDER}?")]
    memory = log_memory(asked, preset("coding-agent"))
    assert f"L{ASKED_ROW + 1}: {ROWS[ASKED_ROW]}" in memory
    assert log_memory(asked + tool_round("t1", "track_order", "{}", order=ORDER), preset("coding-agent")) == memory
