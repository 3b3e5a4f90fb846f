"""Properties of the assembler over generated agent transcripts and policies (hypothesis).

- the projection is a valid request: every call keeps exactly one answer, in order;
- system and user messages, the latest round, and failed or pending results go through verbatim
  (unless the policy withholds them for privacy); an assistant answer without calls is forwarded
  whole or not at all (only an old turn's prose beside its calls may become a note);
- the same inputs give the same bytes;
- between epoch moves each forwarded request extends the previous one byte for byte.
"""
from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.commands.replay import protocol_problems
from policies.assembler import assemble
from policies.assembly_types import ContextBudgetExceeded
from policies.path_records import records_for_path
from policies.policy import Policy, policy_from_mapping
from policies.tool_status import tool_result_status
from policies.transcript import message_path

TOOL_NAMES = ["bash", "read_file", "search", "gmail_get", "approve_refund"]
WORDS = ["build", "error", "value", "line", "ok", "config", "the", "tests", "passed", "file", "path", "json"]

text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join)
outputs = st.one_of(
    st.lists(text, min_size=1, max_size=8).map("\n".join),
    st.lists(text, min_size=30, max_size=150).map("\n".join),
    text.map(lambda t: f"Error: {t}"),
    text.map(lambda t: f"status: awaiting approval for {t}"),
    st.just(""),
)


@st.composite
def transcripts(draw: Any, max_rounds: int = 8) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": draw(text)},
                                      {"role": "user", "content": draw(text)}]
    for number in range(draw(st.integers(2, max_rounds))):
        if draw(st.booleans()) and number:
            messages.append({"role": "user", "content": draw(text)})
        calls = []
        for index in range(draw(st.integers(1, 3))):
            name = draw(st.sampled_from(TOOL_NAMES))
            arguments = json.dumps({"path": draw(st.sampled_from(["a.py", "b.py"])), "q": draw(text)})
            calls.append({"id": f"call_{number}_{index}", "type": "function",
                          "function": {"name": name, "arguments": arguments}})
        messages.append({"role": "assistant", "content": draw(st.none() | text), "tool_calls": calls})
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": draw(outputs)})
    if draw(st.booleans()):
        messages.append({"role": "assistant", "content": draw(text)})
    return messages


@st.composite
def policies(draw: Any, plain: bool = False) -> Policy:
    compaction = {
        "keep_recent_rounds": draw(st.integers(1, 3)),
        "trigger_tokens": draw(st.sampled_from([0, 50, 400, 2000])),
        "clear_at_least_tokens": draw(st.sampled_from([0, 20, 300])),
        "min_tokens": draw(st.sampled_from([0, 10, 80])),
        "horizon": draw(st.sampled_from([3.0, 1000.0])),
        "argument_min_tokens": draw(st.sampled_from([5, 300])),
        "thought_min_tokens": draw(st.sampled_from([None, 1, 30])),
        "head_chars": draw(st.sampled_from([40, 200])),
        "tail_chars": draw(st.sampled_from([20, 100])),
    }
    tools: list[dict[str, Any]] = [{"match": ["approve_*"], "compact": False}]
    if not plain:
        if draw(st.booleans()):
            tools.append({"match": ["read_file"], "supersede_on": "arguments.path"})
        if draw(st.booleans()):
            tools.append({"match": ["gmail_*"], "privacy": "restricted"})
        if draw(st.booleans()):
            tools.append({"match": ["search"], "stale_after": "1m"})
    raw: dict[str, Any] = {"name": "generated", "compaction": compaction, "tools": tools}
    if not plain and draw(st.booleans()):
        raw["budget"] = {"max_prompt_tokens": draw(st.integers(200, 4000))}
    return policy_from_mapping(raw, "<hypothesis>")


def project(pol: Policy, messages: list[dict[str, Any]], now: float = 10_000.0):
    path = message_path("t", messages)
    return assemble(pol, messages, records_for_path(path, now, observed_at={}), now)


def _answers_in_order(projection_messages: list[dict[str, Any]]) -> None:
    assert protocol_problems(projection_messages) == []
    for index, message in enumerate(projection_messages):
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            continue
        ids = [c["id"] for c in message["tool_calls"]]
        following = []
        for later in projection_messages[index + 1:]:
            if later.get("role") != "tool":
                break
            following.append(later["tool_call_id"])
        assert sorted(following) == sorted(ids)


PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(transcripts(), policies())
def test_projection_is_valid_and_keeps_what_it_must(messages: list[dict[str, Any]], pol: Policy) -> None:
    try:
        projection = project(pol, messages)
    except ContextBudgetExceeded:
        return  # what must be kept did not fit: an error, never a silent drop
    _answers_in_order(projection.messages)
    kept = [d for d in projection.decisions if d.action != "omitted"]
    assert len(kept) == len(projection.messages)
    forwarded = {d.index: m for d, m in zip(kept, projection.messages)}
    restricted = {i for i, d in enumerate(projection.decisions) if d.action == "withheld"}
    last_round_start = max(i for i, m in enumerate(messages) if m.get("role") == "assistant" and m.get("tool_calls"))
    for index, message in enumerate(messages):
        role = message["role"]
        if role in ("system", "user"):
            assert forwarded[index] == message  # verbatim, never dropped
        elif index >= last_round_start and index not in restricted:
            assert forwarded[index]["content"] == message["content"]  # the latest round
        elif role == "assistant" and not message.get("tool_calls") and index in forwarded:
            assert forwarded[index] == message  # an answer without calls: only the budget may drop it, whole
        elif role == "tool" and index not in restricted and tool_result_status(message["content"]) == "pending":
            assert forwarded.get(index, message)["content"] == message["content"] or \
                projection.decisions[index].action == "superseded"


@PROPERTY
@given(transcripts(), policies())
def test_same_inputs_give_the_same_bytes(messages: list[dict[str, Any]], pol: Policy) -> None:
    try:
        first = project(pol, messages)
    except ContextBudgetExceeded:
        return
    second = project(pol, copy.deepcopy(messages))
    assert json.dumps(first.messages) == json.dumps(second.messages)
    assert first.decisions == second.decisions and first.omissions == second.omissions


@PROPERTY
@given(transcripts(max_rounds=10), policies(plain=True))
def test_each_request_extends_the_previous_between_moves(messages: list[dict[str, Any]], pol: Policy) -> None:
    # Only failures retried later re-render an old round outside a move; leave them out here.
    for message in messages:
        if message["role"] == "tool" and tool_result_status(message["content"]) == "error":
            message["content"] = "fixed: " + message["content"]
    ends = [i for i, m in enumerate(messages) if m["role"] == "tool" and (
        i + 1 == len(messages) or messages[i + 1]["role"] != "tool")]
    previous = None
    for end in ends:
        projection = project(pol, messages[: end + 1])
        if previous is not None and projection.boundary_round == previous.boundary_round:
            assert projection.messages[: len(previous.messages)] == previous.messages
        previous = projection
