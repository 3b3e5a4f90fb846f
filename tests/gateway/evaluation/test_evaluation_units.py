"""The evaluation's pure parts: arms, signals, next actions, intervals and verdicts."""
from __future__ import annotations

import json
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.evaluation.arms import HOLDOUT, PROJECTED, arm_for, conversation_key, share_point
from gateway.evaluation.next_action import compare, next_action
from gateway.evaluation.signals import answer_signals, request_signals, run_signals
from gateway.evaluation.statistics import MIN_CONVERSATIONS, difference, ratio, verdict, wilson
from policies.policy import Policy
from policies.transcript import message_path


def call(name: str, **arguments: object) -> dict:
    return {"id": f"c{random.random()}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


TEXT = st.text(alphabet="abc xyz", max_size=12)


@settings(max_examples=60, deadline=None)
@given(system=TEXT, first=TEXT, later=st.lists(TEXT, max_size=6))
def test_a_conversation_keeps_its_key_from_its_first_request_on(system: str, first: str, later: list[str]) -> None:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    key = conversation_key("t", None, message_path("t", messages), "req_1")
    for turn, text in enumerate(later):
        messages += [{"role": "assistant", "content": f"answer {turn}"}, {"role": "user", "content": text}]
        assert conversation_key("t", None, message_path("t", messages), f"req_{turn + 2}") == key


def test_a_label_names_the_conversation_and_the_shares_are_what_the_policy_says() -> None:
    path = message_path("t", [{"role": "user", "content": "hi"}])
    assert conversation_key("t", "sess", path, "r") == conversation_key("t", "sess", [], "other")
    half = Policy(name="p", evaluation={"holdout_share": 0.5})
    arms = [arm_for(half, "t", f"label {n}", [], "r") for n in range(2000)]
    assert 0.45 < arms.count(HOLDOUT) / len(arms) < 0.55
    assert {arm_for(Policy(name="p"), "t", f"label {n}", [], "r") for n in range(50)} == {PROJECTED}
    every = Policy(name="p", evaluation={"holdout_share": 1.0})
    assert {arm_for(every, "t", f"label {n}", [], "r") for n in range(50)} == {HOLDOUT}
    assert 0 <= share_point("x", "y") < 1
    held = half.held_out
    assert not held.enabled and not held.cache_markers and held.evaluation == half.evaluation


def test_signals_of_a_request_and_its_answer() -> None:
    read = call("read_file", path="a.py")
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": None, "tool_calls": [read]},
                {"role": "tool", "tool_call_id": read["id"], "content": "Traceback (most recent call last): boom"},
                {"role": "assistant", "content": None, "tool_calls": [call("ls"), call("grep", q="x")]},
                {"role": "tool", "tool_call_id": "a", "content": "file list"},
                {"role": "tool", "tool_call_id": "b", "content": "permission denied", "is_error": False},
                {"role": "tool", "tool_call_id": "c", "content": "fine", "is_error": True}]
    assert request_signals(messages) == {"tool_results": 3, "tool_errors": 2}
    again = {"role": "assistant", "content": None,
             "tool_calls": [{"id": "z", "function": {"name": "read_file", "arguments": '{ "path":"a.py" }'}},
                            call("read_file", path="b.py")]}
    assert answer_signals(messages, again) == {"answer_calls": 2, "repeated_calls": 1, "final_answer": False}
    assert answer_signals(messages, {"role": "assistant", "content": "done"})["final_answer"] is True
    assert answer_signals(messages, None) == {"answer_calls": 0, "repeated_calls": 0, "final_answer": False}
    signals = run_signals(messages, again, [{"action": "rehydrated"}, {"action": "rehydration_refused"}])
    assert signals["rehydrations"] == 1


def test_next_actions_agree_on_the_same_calls_in_any_order_or_on_two_answers() -> None:
    one = {"role": "assistant", "tool_calls": [call("a", x=1, y=2), call("b")]}
    other = {"role": "assistant", "tool_calls": [call("b"), {"function": {"name": "a", "arguments": '{"y":2,"x":1}'}}]}
    assert compare(next_action(one), next_action(other)).same_action
    half = compare(next_action(one), next_action({"tool_calls": [call("b")]}))
    assert not half.same_action and half.similarity == 0.5
    texts = compare(next_action({"content": "The code is 42."}), next_action({"content": [{"type": "text",
                                                                                          "text": "the code is 42"}]}))
    assert texts.same_action and 0.8 <= texts.similarity < 1
    assert not compare(next_action({"content": "done"}), next_action(one)).same_action
    assert next_action({"content": "  "}).kind == "none"


def test_the_ratio_estimators_interval_and_the_verdicts() -> None:
    same = [(1.0, 2.0)] * 20
    estimate = ratio(same)
    assert estimate.rate == 0.5 and estimate.interval == (0.5, 0.5)
    assert verdict(estimate, ratio(same), lower_is_better=True) == "no_difference"
    more = ratio([(2.0, 2.0)] * 20)
    assert verdict(more, estimate, lower_is_better=True) == "worse"
    assert verdict(more, estimate, lower_is_better=False) == "better"
    assert verdict(ratio(same[:MIN_CONVERSATIONS - 1]), estimate, True) == "insufficient_data"
    assert ratio([]).rate is None and difference(ratio([]), estimate) is None
    # A noisy signal: the interval is the ratio estimator's (mean of y over mean of x, clustered).
    pairs = [(float(n % 3), 1.0) for n in range(30)]
    noisy = ratio(pairs)
    mean = sum(y for y, _ in pairs) / 30
    sd = math.sqrt(sum((y - mean) ** 2 for y, _ in pairs) / 29)
    low, high = noisy.interval
    assert math.isclose(high - low, 2 * 1.959963984540054 * sd / math.sqrt(30), rel_tol=1e-9)
    assert verdict(noisy, ratio([(float((n + 1) % 3), 1.0) for n in range(30)]), True) == "no_difference"


def test_wilson() -> None:
    assert wilson(0, 0) is None
    low, high = wilson(0, 50)
    assert low == 0 and 0 < high < 0.1
    low, high = wilson(50, 50)
    assert 0.9 < low < 1 and high == 1.0
    low, high = wilson(10, 100)
    assert 0.05 < low < 0.1 < high < 0.18


def test_a_policys_evaluation_section_is_checked_field_by_field() -> None:
    import pytest

    from policies.policy import PolicyError, policy_from_mapping

    for field, value in (("holdout_share", 1.5), ("shadow_share", -0.1), ("shadow_budget_usd_per_day", -1),
                         ("holdout_share", "half"), ("sample", 1)):
        with pytest.raises(PolicyError) as caught:
            policy_from_mapping({"name": "p", "evaluation": {field: value}}, "p.yaml")
        assert caught.value.field == f"evaluation.{field}"
    policy = policy_from_mapping({"name": "p", "evaluation": {"holdout_share": 0.25}}, "p.yaml")
    assert policy.evaluation.holdout_share == 0.25 and policy.evaluation.shadow_share == 0
    assert policy.version_label != policy_from_mapping({"name": "p"}, "p.yaml").version_label
