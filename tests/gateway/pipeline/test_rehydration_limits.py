"""Rehydration never ends in silence (issue 32): a model that needs five memories back, under a policy that
allows three hidden rounds, finishes with the right answer in every wire format, JSON and streamed, whether
it asks for one artifact a round or for all of them in one call.

The model is the reader fake (gateway/fake_upstream/reader.py) behind a fake upstream of its own; the
client is testkit/reader_formats.py, in Chat Completions, Responses, Anthropic Messages (to a native
Anthropic deployment, so the tool is added mid-conversation) and Gemini. The files hold one fact each in
the middle of plain lines, which the policy's memories lose; three plain files follow, so that when the
model first answers every fact is behind a memory. One a round, the model rehydrates three, is told that
was the last, gets no gateway tool on the next upstream request, and reads the fourth again with its own
tool; the client's next request has the three it had back forwarded whole, and the model asks the gateway
for the fifth. All at once, it rehydrates them in one call. Under coding-agent (one round kept whole) too.
A model that calls the gateway's tool past the bound anyway gets its own words to the client, or the
gateway's text when it said nothing. Then the several-artifacts answer itself: fences, refusals, bounds.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from gateway.fake_upstream.reader import (
    Call,
    Reader,
    Result,
    chat_seen,
    gemini_seen,
    messages_seen,
    responses_seen,
    visible_facts,
)
from testkit.fake_upstream import FakeUpstream
from testkit.gateway import RunningGateway, dashboard_sign_in, settings_for, start_gateway
from testkit.reader_client import READ_TOOL, spread_workload
from testkit.reader_formats import FORMATS, FormatConversation, run_in

KEY = "sk-limits"
SMALL_KEY, SMALL_BYTES = "sk-small", 8000  # a tenant whose policy bounds rehydration to about 1.4 files
OTHER_KEY = "sk-other"
CODING_KEY = "sk-coding"  # a tenant under the coding-agent preset: one round kept whole, three hidden rounds
MAX_ROUNDS = 3
POLICY = {"name": "lossy-rehydrating", "version": 1,
          "compaction": {"keep_recent_rounds": 2, "trigger_tokens": 0, "clear_at_least_tokens": 0, "min_tokens": 0,
                         "head_chars": 10, "tail_chars": 10, "salient_chars": 0},
          "rehydration": {"max_rounds": MAX_ROUNDS}}
MODELS = {"chat": "fake", "responses": "fake", "anthropic": "claude-fake", "gemini": "gemini-fake"}
SEEN = {"chat": chat_seen, "responses": responses_seen, "anthropic": messages_seen, "gemini": gemini_seen}
TOOL = "gateway_rehydrate"


@pytest.fixture(scope="module")
def reader_fake() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(reader_fake: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    tmp: Path = tmp_path_factory.mktemp("limits")
    (tmp / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    fake = reader_fake
    models = [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": fake.api_base,
                                                   "api_key": "sk-upstream"}},
              {"name": "claude-*", "litellm_params": {"model": "anthropic/claude-*", "api_base": fake.url,
                                                       "api_key": "sk-upstream"}},
              {"name": "gemini-*", "litellm_params": {"model": "gemini/gemini-*", "api_base": f"{fake.url}/v1beta",
                                                       "api_key": "sk-upstream"}}]
    (tmp / "small.yaml").write_text(yaml.safe_dump({**POLICY, "rehydration": {"max_rounds": MAX_ROUNDS,
                                                                              "max_bytes": SMALL_BYTES}}))
    tenants = [{"id": "limits", "api_keys": [KEY], "policy": "policy.yaml"},
               {"id": "small", "api_keys": [SMALL_KEY], "policy": "small.yaml"},
               {"id": "other", "api_keys": [OTHER_KEY], "policy": "policy.yaml"},
               {"id": "coding", "api_keys": [CODING_KEY], "policy": "coding-agent"}]
    settings = settings_for(fake.api_base, f"sqlite:///{tmp / 'gateway.db'}", tmp, models=models, tenants=tenants)
    running, server = start_gateway(settings, fake)
    try:
        yield running
    finally:
        server.stop()


def upstream_views(gateway: RunningGateway, form: str) -> list[Any]:
    """Every upstream request of the conversation, as the reader saw it."""
    views = []
    for request in gateway.fake.requests:
        path = request.get("path")
        kind = ("gemini" if str(path).startswith("/v1beta/") else "anthropic" if path == "/v1/messages"
                else "responses" if path == "/v1/responses" else "chat" if path is None else None)
        if kind == form:
            views.append(SEEN[form](request["body"]))
    return views


def trailing_rehydrations(seen: Any) -> int:
    """How many hidden rounds end the request: calls to the gateway's tool after the client's last result."""
    count = 0
    for event in reversed(seen.events):
        name = getattr(event, "name", None)
        if name is None:  # a result: counted with its call
            continue
        if name != TOOL:
            break
        count += 1
    return count


def first_asked(views: list[Any], names: list[str]) -> dict[str, str]:
    """The facts the model could see when it first asked the gateway for an artifact."""
    for seen in views:
        calls = [e for e in seen.events if isinstance(e, Call)]
        if calls and calls[-1].name == TOOL and trailing_rehydrations(seen) == 1:
            return visible_facts([e.text for e in seen.events[:-2] if isinstance(e, Result)], names)
    raise AssertionError("the model never asked the gateway for an artifact")


def records(gateway: RunningGateway, conversation: FormatConversation) -> list[dict[str, Any]]:
    with gateway.client(key=KEY) as http:
        return [http.get(f"/api/requests/{turn.request_id}").json() for turn in conversation.turns]


def limits_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for d in record["assembly"]["decisions"] if d["action"] == "rehydration_limit"]


def five_needed(gateway: RunningGateway, form: str, stream: bool, all_at_once: bool,
                key: str) -> tuple[Any, FormatConversation, list[Any]]:
    """The reader's five-fact task in `form` for the tenant of `key`: it ends in the right answer, never with
    an empty turn, and five memories were needed (no fact visible when the model first asked). Returns the
    workload, the conversation and every upstream request as the reader saw it."""
    gateway.fake.reset()
    Reader(all_at_once=all_at_once).drive(gateway.fake.state)
    label = f"{'coding' if key == CODING_KEY else 'lossy'}-{form}-{'stream' if stream else 'json'}-" \
            f"{'all' if all_at_once else 'one'}"
    workload = spread_workload(facts=5, plain=3, label=label)
    conversation = run_in(form, gateway.url, workload, stream=stream, key=key, model=MODELS[form])
    assert conversation.answer == workload.answer
    assert not any(turn.empty for turn in conversation.turns)  # never an empty turn
    views = upstream_views(gateway, form)
    assert first_asked(views, list(workload.facts)) == {}  # five memories needed
    return workload, conversation, views


@pytest.mark.parametrize("all_at_once", [False, True], ids=["one-a-round", "all-at-once"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("form", list(FORMATS))
def test_five_memories_needed_end_in_the_right_answer(gateway: RunningGateway, form: str, stream: bool,
                                                      all_at_once: bool) -> None:
    workload, conversation, views = five_needed(gateway, form, stream, all_at_once, KEY)
    files = list(workload.files)
    hidden = [trailing_rehydrations(seen) for seen in views]
    for seen, rounds in zip(views, hidden):  # the gateway's tool, offered until the bound is reached ...
        # ... from the first request on, or on Anthropic from the first memory on (added mid-conversation)
        memory = any(isinstance(e, Result) and "artifact:art_" in e.text for e in seen.events)
        if rounds == MAX_ROUNDS:
            assert TOOL not in seen.offered
        elif form != "anthropic" or memory:
            assert TOOL in seen.offered, (rounds, seen.offered)
    run_records = records(gateway, conversation)
    limited = [r for r in run_records if limits_of(r)]
    if all_at_once:
        assert conversation.reads == files  # every file read once: the five came back in one hidden round
        assert max(hidden) == 1 and not limited
        last = run_records[-1]["assembly"]["decisions"]
        given = [d for d in last if d["action"] == "rehydrated"]
        assert len(given) >= 5 and {d["round"] for d in given} == {1}  # every memory, in one call
    else:
        # Three back through the gateway, the bound; then the model reads the fourth again with its own tool;
        # the next request forwards the three it had back whole, and it asks the gateway for the last one
        assert conversation.reads == [*files, files[3]]
        assert max(hidden) == MAX_ROUNDS and len(limited) == 1
        (record,) = limited
        assert [(d["reason"], d["round"]) for d in limits_of(record)] == [("max_rounds", MAX_ROUNDS)]
        assert record["assembly"]["rehydrations"] == MAX_ROUNDS
        last = run_records[-1]["assembly"]["decisions"]
        assert sum(d["reason"] == "rehydrated_before" for d in last) == 3
        assert [d["round"] for d in last if d["index"] is None and d["action"] == "rehydrated"] == [1]


@pytest.mark.parametrize("all_at_once", [False, True], ids=["one-a-round", "all-at-once"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("form", list(FORMATS))
def test_under_coding_agent_what_the_model_had_back_stays_whole(gateway: RunningGateway, form: str, stream: bool,
                                                                 all_at_once: bool) -> None:
    # coding-agent keeps only the latest round whole: a result the model reads again with its own tool past
    # the bound is a memory on the next request. What it had back through the gateway is forwarded whole
    # from then on, so the hidden rounds it has left go to what it still lacks, and it finishes.
    workload, conversation, views = five_needed(gateway, form, stream, all_at_once, CODING_KEY)
    with gateway.client(key=CODING_KEY) as http:
        run_records = [http.get(f"/api/requests/{turn.request_id}").json() for turn in conversation.turns]
    given = [d["artifact_id"] for r in run_records for d in r["assembly"]["decisions"]
             if d["index"] is None and d["action"] == "rehydrated"]
    assert len(given) == len(set(given))  # none had to be asked for twice
    later = [d for r in run_records for d in r["assembly"]["decisions"] if d["reason"] == "rehydrated_before"]
    if all_at_once:
        assert len(given) >= 5 and conversation.reads == list(workload.files)
    else:
        # three, the bound; the model reads one file again itself; the next request has the three whole and
        # the file read, and the model asks for the last: each fact back once, one way or the other
        read_again = len(conversation.reads) - len(workload.files)
        assert len(given) > 3 and len(given) + read_again == 5
        assert {d["artifact_id"] for d in later} >= set(given[:3])
        assert all(d["action"] == "rehydrated" for d in later)


def rehydrate_call(number: int) -> dict[str, Any]:
    """A model that calls the gateway's tool whether it is offered or not (here for an id no one has)."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"gw_{number}", "type": "function",
         "function": {"name": TOOL, "arguments": json.dumps({"artifact_id": f"art_{number:04x}"})}}]}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("form", list(FORMATS))
def test_a_model_that_ignores_the_tool_list_past_the_bound_never_leaves_the_client_an_empty_turn(
        gateway: RunningGateway, form: str, stream: bool) -> None:
    gateway.fake.reset()
    for number in range(MAX_ROUNDS + 1):
        gateway.fake.script_message(rehydrate_call(number))
    workload = spread_workload(facts=1, plain=0, label=f"ignores-{form}-{stream}")
    conversation = run_in(form, gateway.url, workload, stream=stream, key=KEY, model=MODELS[form])

    (turn,) = conversation.turns
    assert not turn.calls and "rehydration limit was reached (3 rounds in one request)" in turn.text
    views = upstream_views(gateway, form)
    assert [trailing_rehydrations(seen) for seen in views] == [0, 1, 2, 3]
    assert TOOL not in views[-1].offered
    (record,) = records(gateway, conversation)
    assert [(d["reason"], d["round"]) for d in limits_of(record)] == [
        ("max_rounds", 3), ("called_past_limit", 3), ("empty_answer", 3)]
    assert json.dumps(record["response"]).count("rehydration limit was reached") == 1  # the answer as recorded
    with gateway.client(key=KEY) as http:  # the dashboard's inspector shows it with the run's rehydrations
        dashboard_sign_in(http, KEY)
        page = http.get(f"/dashboard/requests/{turn.request_id}").text
    table = page[page.index('id="rehydrations"'):]
    assert "rehydration limit" in table and "max_rounds" in table and "empty_answer" in table


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("form", list(FORMATS))
def test_past_the_bound_the_models_own_words_are_the_answer(gateway: RunningGateway, form: str,
                                                            stream: bool) -> None:
    gateway.fake.reset()
    for number in range(MAX_ROUNDS):
        gateway.fake.script_message(rehydrate_call(number))
    last = rehydrate_call(MAX_ROUNDS)
    last["content"] = "I could not find every fact."
    gateway.fake.script_message(last)
    workload = spread_workload(facts=1, plain=0, label=f"words-{form}-{stream}")
    conversation = run_in(form, gateway.url, workload, stream=stream, key=KEY, model=MODELS[form])

    (turn,) = conversation.turns
    assert (turn.text, turn.calls) == ("I could not find every fact.", [])
    (record,) = records(gateway, conversation)
    assert [d["reason"] for d in limits_of(record)] == ["max_rounds", "called_past_limit"]


def compacted_files(gateway: RunningGateway, label: str, key: str = KEY) -> tuple[list[dict[str, Any]], list[str],
                                                                                  list[str]]:
    """A Chat conversation of six file reads sent once: its messages, and the artifact ids its memories
    name with the files' bytes, in order."""
    workload = spread_workload(facts=6, plain=0, label=label)
    messages: list[dict[str, Any]] = [{"role": "user", "content": workload.task}]
    for number, (path, text) in enumerate(workload.files.items()):
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"r{number}", "type": "function",
             "function": {"name": "read_file", "arguments": json.dumps({"path": path})}}]},
            {"role": "tool", "tool_call_id": f"r{number}", "content": text}]
    gateway.fake.reset()
    gateway.fake.script_message({"role": "assistant", "content": "noted"})
    record = send(gateway, messages, key)
    memories = [d for d in record["assembly"]["decisions"] if d["action"] == "compacted"]
    assert len(memories) >= 3, memories
    return messages, [d["artifact_id"] for d in memories], [messages[d["index"]]["content"] for d in memories]


def send(gateway: RunningGateway, messages: list[dict[str, Any]], key: str) -> dict[str, Any]:
    with gateway.client(key=key) as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": messages,
                                                           "tools": [READ_TOOL]})
        assert response.status_code == 200, response.text
        return http.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()


def asked(gateway: RunningGateway, messages: list[dict[str, Any]], arguments: dict[str, Any],
          key: str = KEY) -> tuple[str, list[dict[str, Any]]]:
    """The gateway's answer to one call of its tool with `arguments`, and the request's rehydration decisions."""
    gateway.fake.reset()
    gateway.fake.script_message({"role": "assistant", "content": None, "tool_calls": [
        {"id": "gw_1", "type": "function", "function": {"name": TOOL, "arguments": json.dumps(arguments)}}]})
    gateway.fake.script_message({"role": "assistant", "content": "done"})
    record = send(gateway, messages + [{"role": "user", "content": "and now?"}], key)
    answer = gateway.fake.requests[1]["body"]["messages"][-1]
    assert answer["role"] == "tool" and answer["tool_call_id"] == "gw_1"
    return answer["content"], [d for d in record["assembly"]["decisions"] if d["index"] is None]


def fenced(answer: str) -> dict[str, tuple[str, str]]:
    """Each artifact given in a several-at-once answer: its id -> (its label, its exact bytes)."""
    out = {}
    for match in re.finditer(r"^<<<(\w+) artifact:(\w+)(.*)\n", answer, re.MULTILINE):
        tag, artifact_id, label = match.groups()
        end = answer.index(f"\n>>>{tag}", match.end())
        out[artifact_id] = (label.strip(), answer[match.end():end])
    return out


def test_several_artifacts_in_one_call_each_exact_between_its_fences(gateway: RunningGateway) -> None:
    messages, ids, files = compacted_files(gateway, "several")
    answer, decisions = asked(gateway, messages, {"artifacts": [
        {"artifact_id": ids[0]}, {"artifact_id": f"artifact:{ids[1]}", "lines": "30-32"}, ids[2]]})

    assert answer.startswith("[gateway_rehydrate: 3 asked, 3 given, 0 refused;")
    given = fenced(answer)
    assert given[ids[0]] == ("", files[0]) and given[ids[2]] == ("", files[2])
    assert given[ids[1]] == ("lines 30-32 of 61", "\n".join(files[1].split("\n")[29:32]))
    assert [(d["action"], d["artifact_id"], d.get("lines")) for d in decisions] == [
        ("rehydrated", ids[0], None), ("rehydrated", ids[1], [30, 32]), ("rehydrated", ids[2], None)]
    single, _ = asked(gateway, messages, {"artifact_id": ids[0]})  # the one-artifact form is as it was
    assert single == files[0]


def test_each_refusal_says_which_and_why_and_gives_nothing_of_it(gateway: RunningGateway) -> None:
    _, theirs, their_files = compacted_files(gateway, "theirs", key=OTHER_KEY)
    messages, ids, _ = compacted_files(gateway, "refusals")
    assert len(ids) >= 4
    answer, decisions = asked(gateway, messages, {"artifacts": [
        {"artifact_id": "art_00000000deadbeef"}, {"artifact_id": theirs[0]}, {"lines": "1-3"}, ids[0],
        {"artifact_id": ids[0]}, {"artifact_id": ids[1], "lines": "9-3"}, ids[2], ids[3], ids[1], ids[2]]})

    assert answer.startswith("[gateway_rehydrate: 10 asked, 3 given, 7 refused;")
    assert set(fenced(answer)) == {ids[0], ids[2], ids[3]}
    assert "no artifact:art_00000000deadbeef in this conversation" in answer
    assert f"no artifact:{theirs[0]} in this conversation" in answer  # another tenant's is one that does not exist
    assert their_files[0].split("\n")[30] not in answer
    assert "artifacts[2] names no artifact_id" in answer and f"artifact:{ids[0]} is asked for twice" in answer
    assert "a range ends after it starts" in answer and "one call gives at most 8 artifacts" in answer
    refused = [(d["reason"], d["artifact_id"]) for d in decisions if d["action"] == "rehydration_refused"]
    assert refused[:5] == [("not_found", "art_00000000deadbeef"), ("not_found", theirs[0]),
                           ("invalid_arguments", None), ("duplicate", ids[0]), ("invalid_arguments", ids[1])]
    assert refused[5:] == [("too_many", ids[1]), ("too_many", ids[2])]


def test_the_policys_bounds_hold_for_the_whole_answer(gateway: RunningGateway) -> None:
    messages, ids, files = compacted_files(gateway, "bounded", key=SMALL_KEY)
    answer, decisions = asked(gateway, messages, {"artifacts": ids[:3]}, key=SMALL_KEY)

    given = fenced(answer)
    assert given[ids[0]][1] == files[0]  # whole, within the bound
    excerpt = given[ids[1]][1]
    assert files[1].startswith(excerpt.split("\n[gateway_rehydrate: excerpt of")[0]) and len(excerpt) < len(files[1])
    assert ids[2] not in given and f"artifact:{ids[2]}: this answer reached the policy's bound (8000 bytes" in answer
    assert sum(len(body.encode()) for _, body in given.values()) <= SMALL_BYTES + 200  # the excerpt's note
    assert [(d["action"], d["reason"]) for d in decisions] == [
        ("rehydrated", "model_request"), ("rehydrated", "bounded_excerpt"), ("rehydration_refused", "answer_bound")]


def test_the_tool_says_it_takes_several_artifacts(gateway: RunningGateway) -> None:
    compacted_files(gateway, "described")
    (tool,) = [t for t in gateway.fake.requests[-1]["body"]["tools"] if t["function"]["name"] == TOOL]
    assert "Several at once: artifacts, up to 8" in tool["function"]["description"]
    assert "{artifact_id, lines}" in tool["function"]["description"]
    assert tool["function"]["parameters"]["properties"]["artifacts"]["type"] == "array"
