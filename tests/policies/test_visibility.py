"""One visibility rule: the assembler's decision and rehydration's answer agree with `access` everywhere."""
from __future__ import annotations

import itertools
import json

import pytest

from gateway.pipeline.rehydration import Rehydrator
from policies.assembler import assemble
from policies.assembly_types import Records
from policies.path_records import records_for_path
from policies.policy import policy_from_mapping
from policies.transcript import message_path
from policies.visibility import access

BIG = "\n".join(f"line {i}: words of output that make the result worth compacting" for i in range(80))
POLICY = policy_from_mapping({
    "name": "visibility", "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 0, "clear_at_least_tokens": 0,
                                         "min_tokens": 0, "horizon": 1000.0},
    "privacy": {"providers": {"vault": ["public", "internal", "restricted"], "*": ["public", "internal"]}},
    "tools": [{"match": ["conv_*"], "visibility": "conversation"},
              {"match": ["mem_*"], "visibility": "memory"},
              {"match": ["own_*"], "visibility": "participant"},
              {"match": ["secret_*"], "privacy": "restricted"},
              {"match": ["promoted_*"], "promote_to_parent": True}],
}, "<test>")
TOOLS = ["conv_read", "mem_read", "own_read", "secret_read", "promoted_read"]


def transcript(tool: str) -> list[dict]:
    call = {"role": "assistant", "name": "alice", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": tool, "arguments": "{}"}}]}
    later = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "conv_other", "arguments": "{}"}}]}
    return [{"role": "system", "content": "agents"}, {"role": "user", "content": "go"}, call,
            {"role": "tool", "tool_call_id": "c1", "content": f"{tool} says\n{BIG}"},
            later, {"role": "tool", "tool_call_id": "c2", "content": "fresh\n" + BIG}]


@pytest.mark.parametrize("tool, provider, participant, from_subagent", list(itertools.product(
    TOOLS, ["openai", "vault"], [None, "alice", "bob"], [False, True])))
def test_assembler_and_rehydration_follow_the_one_rule(tool: str, provider: str, participant: str | None,
                                                       from_subagent: bool) -> None:
    messages = transcript(tool)
    path = message_path("t", messages)
    plain = records_for_path(path, 0.0, owners={})
    view = plain.artifacts[3]
    owners = {view.artifact_id: "alice"}
    subagents = {view.sha256: tool} if from_subagent else {}
    records = records_for_path(path, 0.0, owners=owners, subagent_results=subagents)
    view = records.artifacts[3]
    expected = access(POLICY, view, provider=provider, participant=participant, subagent_results=subagents)
    projection = assemble(POLICY, messages, records, 0.0, provider=provider, participant=participant)
    decision = projection.decisions[3]
    forwarded = projection.messages[3]["content"]
    if expected.level == "none":
        assert decision.action == "withheld" and decision.reason == expected.reason
        assert BIG[:60] not in forwarded
    elif expected.level == "memory":
        assert (decision.action, decision.reason) == ("compacted", "other_participant")
    else:
        assert decision.action in ("compacted", "verbatim") and decision.reason != "other_participant"
    # Rehydration gives raw bytes exactly when the rule says raw.
    rehydrator = Rehydrator(policy=POLICY, records=records, store=None, tenant="t",  # type: ignore[arg-type]
                            participant=participant or "alice", provider=provider, rehydrations=[])
    as_rehydrator_sees = access(POLICY, view, provider=provider, participant=participant or "alice",
                                subagent_results=subagents)
    refusal = rehydrator._policy_refusal(view)
    assert (refusal is None) == as_rehydrator_sees.raw
    # A user naming the artifact gets it raw only under the same rule.
    named = messages + [{"role": "assistant", "content": "ok"},
                        {"role": "user", "content": f"show artifact:{view.artifact_id}"}]
    named_path = message_path("t", named)
    named_records = Records(artifacts=records_for_path(named_path, 0.0, owners=owners,
                                                       subagent_results=subagents).artifacts,
                            subagent_results=subagents)
    projection = assemble(POLICY, named, named_records, 0.0, provider=provider, participant=participant)
    raw_back = projection.messages[3]["content"] == messages[3]["content"]
    assert raw_back == expected.raw, json.dumps(projection.decisions[3].as_dict())
