"""Rehydration inside the gateway, participants, subagents and session labels (issue 4).

The fake upstream plays a model that calls `gateway_rehydrate`; the client is
the real `openai` SDK and must see nothing of the extra round.
"""
from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.gateway import OTHER_TENANT_KEY, TENANT_KEY, RunningGateway

FILLER = "\n".join(f"row {i}: status nominal, nothing to report for this line" for i in range(120))
INVOICE = f"invoice INV-7\n{FILLER}\nTOTAL DUE: 48,213.77 EUR (exact)\n{FILLER}\nend of invoice"

POLICY = {
    "name": "rehydration-test",
    "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 0, "clear_at_least_tokens": 0,
                   "min_tokens": 50, "horizon": 1000},
    "rehydration": {"max_rounds": 2, "max_bytes": 200_000, "max_tokens": 50_000},
    "tools": [
        {"match": ["gmail_*"], "privacy": "restricted"},
        {"match": ["scratch_*"], "visibility": "participant"},
        {"match": ["notes_*"], "visibility": "memory"},
    ],
}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
         for n in ("fetch_invoice", "read_ledger", "gmail_get", "scratch_pad", "notes_read", "run_query")]


@pytest.fixture
def gateway(rehydration_gateway: RunningGateway) -> RunningGateway:
    return rehydration_gateway


def call(call_id: str, name: str, author: str | None = None, **arguments: Any) -> dict:
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}
    if author:
        message["name"] = author
    return message


def result(call_id: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def rehydrate(artifact_id: str, call_id: str = "gw_1") -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": "gateway_rehydrate", "arguments": json.dumps({"artifact_id": artifact_id})}}]}


def send(gateway: RunningGateway, messages: list[dict], key: str = TENANT_KEY, **headers: str) -> dict:
    with gateway.client(key=key) as http:
        response = http.post("/v1/chat/completions", headers=headers,
                             json={"model": "fake", "messages": messages, "tools": TOOLS})
        assert response.status_code == 200, response.text
        return http.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()


def invoice_conversation() -> list[dict]:
    return [{"role": "system", "content": "You are a finance agent."},
            {"role": "user", "content": "Load invoice 7."}, call("c1", "fetch_invoice", id=7),
            result("c1", INVOICE), call("c2", "read_ledger", month="10"), result("c2", "ledger ok\n" + FILLER)]


def compacted_invoice_id(gateway: RunningGateway, messages: list[dict], key: str = TENANT_KEY) -> str:
    gateway.fake.script_message({"role": "assistant", "content": "noted"})
    record = send(gateway, messages, key=key)
    decision = next(d for d in record["assembly"]["decisions"] if d["index"] == 3)
    assert decision["action"] == "compacted"
    return decision["artifact_id"]


@pytest.mark.parametrize("stream", [False, True])
def test_model_rehydrates_and_the_client_sees_only_the_answer(gateway: RunningGateway, stream: bool) -> None:
    messages = invoice_conversation()
    artifact_id = compacted_invoice_id(gateway, messages)
    messages += [{"role": "assistant", "content": "noted"}, {"role": "user", "content": "What is the exact total?"}]
    gateway.fake.reset()
    gateway.fake.script_message(rehydrate(artifact_id), usage={"prompt_tokens": 100, "completion_tokens": 10,
                                                                "total_tokens": 110})
    gateway.fake.script_message({"role": "assistant", "content": "The exact total is 48,213.77 EUR."},
                                usage={"prompt_tokens": 300, "completion_tokens": 12, "total_tokens": 312})
    client = openai.OpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)
    if stream:
        raw = client.chat.completions.with_raw_response.create(
            model="fake", messages=messages, tools=TOOLS, stream=True, stream_options={"include_usage": True})
        chunks = list(raw.parse())
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
        assert "gateway_rehydrate" not in json.dumps([c.model_dump() for c in chunks])
        assert chunks[-1].usage.prompt_tokens == 400 and chunks[-1].usage.completion_tokens == 22
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["stop"]
    else:
        raw = client.chat.completions.with_raw_response.create(model="fake", messages=messages, tools=TOOLS)
        completion = raw.parse()
        text = completion.choices[0].message.content
        assert completion.choices[0].message.tool_calls is None
        assert completion.choices[0].finish_reason == "stop"
        assert completion.usage.prompt_tokens == 400 and completion.usage.completion_tokens == 22
    assert text == "The exact total is 48,213.77 EUR."
    first, second = [r["body"] for r in gateway.fake.requests]
    assert "48,213.77" not in json.dumps(first["messages"])  # compacted on the way in ...
    assert any(t["function"]["name"] == "gateway_rehydrate" for t in first["tools"])
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "gw_1", "content": INVOICE}  # ... exact again
    with gateway.client() as http:
        record = http.get(f"/api/requests/{raw.headers['x-gateway-request-id']}").json()
    assert record["usage"]["prompt_tokens"] == 400
    assert record["assembly"]["rehydrations"] == 1
    assert any(d["action"] == "rehydrated" and d["artifact_id"] == artifact_id for d in record["assembly"]["decisions"])
    with gateway.client() as http:  # the run's record (its Rehydrator appended to it) is what /metrics counts
        metrics = http.get("/metrics").text
    assert {tuple(sorted(s.labels.items())): s.value for family in text_string_to_metric_families(metrics)
            for s in family.samples if s.name == "gateway_rehydrations_total"} == {
        (("outcome", "rehydrated"), ("tenant", "acme")): 1.0}


def test_model_rehydrates_the_lines_a_memory_points_at(gateway: RunningGateway) -> None:
    messages = invoice_conversation()
    artifact_id = compacted_invoice_id(gateway, messages)
    memory = gateway.fake.last_body()["messages"][3]["content"]
    assert re.search(r"\[lines \d+-\d+ omitted\]", memory)  # it says which lines it leaves out: a range can be asked
    total_line = INVOICE.split("\n").index("TOTAL DUE: 48,213.77 EUR (exact)") + 1
    messages += [{"role": "assistant", "content": "noted"}, {"role": "user", "content": "What is the exact total?"}]
    asks = {"artifact_id": f"artifact:{artifact_id}", "lines": f"{total_line - 1}-{total_line + 1}"}
    bad = {"artifact_id": artifact_id, "lines": "9-3"}
    gateway.fake.reset()
    for arguments, call_id in ((asks, "gw_1"), (bad, "gw_2")):
        gateway.fake.script_message({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "gateway_rehydrate", "arguments": json.dumps(arguments)}}]})
    gateway.fake.script_message({"role": "assistant", "content": "48,213.77 EUR"})
    record = send(gateway, messages)
    part = gateway.fake.requests[1]["body"]["messages"][-1]["content"]
    lines = INVOICE.split("\n")
    assert part == (f"[gateway_rehydrate: artifact:{artifact_id} lines {total_line - 1}-{total_line + 1} of "
                    f"{len(lines)}]\n" + "\n".join(lines[total_line - 2:total_line + 1]))
    refused = gateway.fake.requests[2]["body"]["messages"][-1]["content"]
    assert "refused" in refused and "a range ends after it starts" in refused
    given = next(d for d in record["assembly"]["decisions"] if d["action"] == "rehydrated")
    assert given["lines"] == [total_line - 1, total_line + 1]
    assert any(d["action"] == "rehydration_refused" and d["reason"] == "invalid_arguments"
               for d in record["assembly"]["decisions"])


def _refused(gateway: RunningGateway, messages: list[dict], artifact_id: str, key: str = TENANT_KEY,
             **headers: str) -> tuple[str, dict]:
    gateway.fake.reset()
    gateway.fake.script_message(rehydrate(artifact_id))
    gateway.fake.script_message({"role": "assistant", "content": "I cannot access that."})
    record = send(gateway, messages, key=key, **headers)
    answer = gateway.fake.requests[1]["body"]["messages"][-1]
    assert answer["role"] == "tool" and "refused" in answer["content"]
    assert record["response"]["choices"][0]["message"]["content"] == "I cannot access that."
    assert "refused" not in json.dumps(record["response"])  # the refusal went to the model, not the client
    decision = next(d for d in record["assembly"]["decisions"] if d["action"] == "rehydration_refused")
    return answer["content"], decision


def test_refuses_another_tenants_artifact(gateway: RunningGateway) -> None:
    theirs = compacted_invoice_id(gateway, invoice_conversation(), key=OTHER_TENANT_KEY)
    ours = invoice_conversation() + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "total?"}]
    text, decision = _refused(gateway, ours, theirs)
    assert decision["reason"] == "not_found" and "48,213.77" not in text


def test_refuses_another_branchs_artifact(gateway: RunningGateway) -> None:
    other_branch = invoice_conversation()
    other_branch[1] = {"role": "user", "content": "Load invoice 7 (the draft)."}
    theirs = compacted_invoice_id(gateway, other_branch)
    ours = invoice_conversation() + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "total?"}]
    _, decision = _refused(gateway, ours, theirs)
    assert decision["reason"] == "other_branch"


def test_refuses_restricted_content_for_a_disallowed_provider(gateway: RunningGateway) -> None:
    mail = "Subject: salary\nYour salary is 187,500 USD.\n" + FILLER
    messages = [{"role": "user", "content": "Read my mail."}, call("m1", "gmail_get", id=1), result("m1", mail),
                call("c2", "read_ledger", month="10"), result("c2", "ledger ok\n" + FILLER)]
    gateway.fake.script_message({"role": "assistant", "content": "ok"})
    record = send(gateway, messages)
    mail_id = next(d["artifact_id"] for d in record["assembly"]["decisions"] if d["action"] == "withheld")
    text, decision = _refused(gateway, messages + [{"role": "user", "content": "exact mail?"}], mail_id)
    assert decision["reason"] == "restricted:restricted" and "187,500" not in text


def test_two_participants_keep_private_results_apart(gateway: RunningGateway) -> None:
    secret = "A's private scratch: hypothesis 42 about the outage\n" + FILLER
    shared = [{"role": "system", "content": "Two agents share this transcript."},
              {"role": "user", "content": "Investigate the outage."},
              call("a1", "scratch_pad", author="agent-a", op="write"), result("a1", secret),
              call("a2", "notes_read", author="agent-a", id=3), result("a2", "team notes: deploy at 14:02\n" + FILLER)]
    gateway.fake.script_message({"role": "assistant", "content": "A here"})
    send(gateway, shared, **{"x-gateway-participant": "agent-a"})
    assert "hypothesis 42" in json.dumps(gateway.fake.last_body()["messages"])  # the owner sees its own
    turn_b = shared + [{"role": "assistant", "name": "agent-a", "content": "A here"},
                       {"role": "user", "content": "Agent B, your view?"}]
    gateway.fake.script_message({"role": "assistant", "content": "B here"})
    record = send(gateway, turn_b, **{"x-gateway-participant": "agent-b"})
    forwarded = json.dumps(gateway.fake.last_body()["messages"])
    assert "hypothesis 42" not in forwarded
    assert "private to another participant" in forwarded
    assert record["assembly"]["omissions"]["private"] == 1
    notes = next(d for d in record["assembly"]["decisions"] if d["index"] == 5)
    assert notes["action"] == "compacted" and notes["reason"] == "other_participant"
    scratch_id = next(d["artifact_id"] for d in record["assembly"]["decisions"] if d["index"] == 3)
    _, decision = _refused(gateway, turn_b, scratch_id, **{"x-gateway-participant": "agent-b"})
    assert decision["reason"] == "private"


def test_parent_never_sees_its_childs_raw_results(gateway: RunningGateway) -> None:
    parent = [{"role": "system", "content": "You orchestrate subagents."},
              {"role": "user", "content": "Find the bad query."}]
    gateway.fake.script_message({"role": "assistant", "content": "delegating"})
    parent_record = send(gateway, parent)
    parent_id = parent_record["id"]
    raw_rows = "child raw rows: customer 4411 card 4242-XXXX\n" + FILLER
    child = [{"role": "system", "content": "You are a subagent."}, {"role": "user", "content": "Run the queries."},
             call("k1", "run_query", sql="select *"), result("k1", raw_rows)]
    gateway.fake.script_message({"role": "assistant", "content": "The slow query is Q7."})
    child_record = send(gateway, child, **{"x-gateway-parent-request": parent_id})
    assert child_record["parent_request_id"] == parent_id
    assert child_record["assembly"]["links"]["parent_request_id"] == parent_id
    assert "4242" in json.dumps(gateway.fake.last_body()["messages"])  # the child sees its own results
    # The orchestrator merges the child's transcript into its own, as some frameworks do.
    merged = parent + [{"role": "assistant", "content": "delegating"}, call("t1", "run_query", sql="select *"),
                       result("t1", raw_rows), call("t2", "notes_read", id=1), result("t2", "The slow query is Q7.")]
    gateway.fake.script_message({"role": "assistant", "content": "Q7 it is."})
    record = send(gateway, merged)
    forwarded = json.dumps(gateway.fake.last_body()["messages"])
    assert "4242" not in forwarded and "The slow query is Q7." in forwarded
    assert record["assembly"]["omissions"]["subagent_private"] == 1


@pytest.mark.parametrize("header", ["x-gateway-session", "x-litellm-session-id", "Helicone-Session-Id"])
def test_session_labels_and_derived_sessions(gateway: RunningGateway, header: str) -> None:
    messages = invoice_conversation()[:2]
    record = send(gateway, messages, **{header: "ticket-981"})
    assert record["session_label"] == "ticket-981"
    again = send(gateway, messages + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}])
    assert again["session_label"] is None and again["session_id"] == record["session_id"]


def test_latest_user_message_naming_an_artifact_brings_it_back_raw(gateway: RunningGateway) -> None:
    messages = invoice_conversation()
    artifact_id = compacted_invoice_id(gateway, messages)
    messages += [{"role": "assistant", "content": "noted"},
                 {"role": "user", "content": f"Use the exact bytes of artifact:{artifact_id} please."}]
    gateway.fake.script_message({"role": "assistant", "content": "ok"})
    record = send(gateway, messages)
    assert gateway.fake.last_body()["messages"][3]["content"] == INVOICE
    assert record["assembly"]["decisions"][3]["action"] == "rehydrated"
    assert record["assembly"]["decisions"][3]["reason"] == "named_by_user"


@pytest.mark.parametrize("stream", [False, True])
def test_client_calls_beside_a_rehydration_are_dropped_and_the_model_asked_again(
        gateway: RunningGateway, stream: bool) -> None:
    messages = invoice_conversation()
    artifact_id = compacted_invoice_id(gateway, messages)
    messages += [{"role": "assistant", "content": "noted"}, {"role": "user", "content": "Total, then the ledger?"}]
    gateway.fake.reset()
    both = rehydrate(artifact_id)
    both["content"] = "Let me check."
    both["tool_calls"].insert(0, {"id": "client_1", "type": "function",
                                  "function": {"name": "read_ledger", "arguments": '{"month": "11"}'}})
    gateway.fake.script_message(both)
    gateway.fake.script_message({"role": "assistant", "content": None, "tool_calls": [
        {"id": "client_2", "type": "function", "function": {"name": "read_ledger", "arguments": '{"month": "11"}'}}]})
    client = openai.OpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)
    if stream:
        chunks = list(client.chat.completions.create(model="fake", messages=messages, tools=TOOLS, stream=True))
        calls = [c for ch in chunks if ch.choices for c in ch.choices[0].delta.tool_calls or []]
        assert [c.id for c in calls if c.id] == ["client_2"]
        assert "gateway_rehydrate" not in json.dumps([c.model_dump() for c in chunks])
        assert "client_1" not in json.dumps([c.model_dump() for c in chunks])
    else:
        completion = client.chat.completions.create(model="fake", messages=messages, tools=TOOLS)
        assert [c.id for c in completion.choices[0].message.tool_calls] == ["client_2"]
        assert completion.choices[0].finish_reason == "tool_calls"
    second = gateway.fake.requests[1]["body"]["messages"]
    hidden_call = second[-2]
    assert [c["id"] for c in hidden_call["tool_calls"]] == ["gw_1"]  # the client's call of that round was dropped
    assert second[-1]["content"] == INVOICE


@pytest.mark.parametrize("stream", [False, True])
def test_past_the_round_bound_the_client_gets_no_gateway_call(gateway: RunningGateway, stream: bool) -> None:
    messages = invoice_conversation()
    artifact_id = compacted_invoice_id(gateway, messages)
    messages += [{"role": "assistant", "content": "noted"}, {"role": "user", "content": "Total?"}]
    gateway.fake.reset()
    for n in range(3):  # max_rounds is 2: the third call to the gateway's tool is not answered
        step = rehydrate(artifact_id, call_id=f"gw_{n}")
        step["content"] = "Checking." if n == 2 else None
        gateway.fake.script_message(step)
    client = openai.OpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)
    if stream:
        chunks = list(client.chat.completions.create(model="fake", messages=messages, tools=TOOLS, stream=True))
        dumped = json.dumps([c.model_dump() for c in chunks])
        assert "gateway_rehydrate" not in dumped and "gw_" not in dumped
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["stop"]
    else:
        completion = client.chat.completions.create(model="fake", messages=messages, tools=TOOLS)
        assert completion.choices[0].message.tool_calls is None
        assert completion.choices[0].finish_reason == "stop"
        assert completion.choices[0].message.content == "Checking."  # the model's own words, never nothing
    assert len(gateway.fake.requests) == 3
    second, last = gateway.fake.requests[1]["body"], gateway.fake.requests[2]["body"]
    assert "last round" not in second["messages"][-1]["content"]
    assert "that was the last round of rehydration this request allows (2)" in last["messages"][-1]["content"]
    assert [t["function"]["name"] for t in last["tools"]] == [t["function"]["name"] for t in TOOLS]  # not ours
    with gateway.client() as http:  # the run's record says the bound was reached, and then called past
        record = http.get(f"/api/requests/{gateway.fake.requests[-1]['headers']['x-client-request-id']}").json()
    assert [(d["reason"], d["round"]) for d in record["assembly"]["decisions"] if d["action"] == "rehydration_limit"] \
        == [("max_rounds", 2), ("called_past_limit", 2)]


@pytest.mark.parametrize("lines, expected", [
    (None, None), ("", None), ("120-160", (120, 160)), (" 7 - 9 ", (7, 9)), ("120-", (120, None)), ("12", (12, 12)),
    ("0-3", ValueError), ("9-3", ValueError), ("lines 3", ValueError), ("-5", ValueError), (True, ValueError),
])
def test_line_ranges_the_tool_accepts(lines: Any, expected: Any) -> None:
    from gateway.pipeline.rehydration import _line_range

    if expected is ValueError:
        with pytest.raises(ValueError):
            _line_range({"lines": lines})
    else:
        assert _line_range({"lines": lines}) == expected
