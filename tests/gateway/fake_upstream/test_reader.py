"""Reader mode of the fake upstream (gateway/fake_upstream/reader.py): a model whose next action depends
only on what it can see. Straight at the fake it reads every file and reports the facts; with a memory in
place of the file that held a fact it brings that file back (the rehydration tool when offered, else the
same call again); through the gateway, a lossy policy makes it read again while coding-agent, on files
whose fact sits where its memories keep it, lets it answer from the memories."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from gateway.cli import main
from gateway.fake_upstream.reader import (Reader, chat_seen, gemini_seen, messages_seen, responses_seen,
                                          visible_facts)
from testkit.fake_upstream import FakeUpstream
from testkit.gateway import RunningGateway, settings_for, start_gateway
from testkit.reader_client import READ_TOOL, reader_workload, run_conversation

READER = Reader()
TASK = "Find them.\nREAD a.txt\nREAD b.txt\nNEED CODE\nNEED OWNER"
MEMORY = ("[compacted artifact:art_0123abcd; 61 lines, 900 tokens, sha256 0123abcdef; untrusted excerpt:]\n<<<ab12\n"
          "line 1\n[lines 2-60 omitted]\nline 61\n>>>ab12")
REHYDRATE_TOOL = {"type": "function", "function": {"name": "gateway_rehydrate", "parameters": {"type": "object"}}}
LOSSY = {"name": "lossy", "version": 1,
         "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 0, "clear_at_least_tokens": 0, "min_tokens": 0,
                        "head_chars": 10, "tail_chars": 10, "salient_chars": 0},
         "rehydration": {"max_rounds": 0}}


def read(call_id: str, path: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": path})}}]}


def chat(*rounds: tuple[str, str], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Chat Completions body: the task, then one read round per (path, result)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for n, (path, result) in enumerate(rounds):
        messages += [read(f"c{n}", path), {"role": "tool", "tool_call_id": f"c{n}", "content": result}]
    return {"model": "fake", "messages": messages, "tools": tools or [READ_TOOL]}


def call_of(step: Any) -> tuple[str, dict[str, Any]]:
    (call,) = step.message["tool_calls"]
    return call["function"]["name"], json.loads(call["function"]["arguments"])


def test_it_reads_each_file_once_in_order_then_reports_what_it_sees() -> None:
    assert call_of(READER.step(chat_seen(chat()))) == ("read_file", {"path": "a.txt"})
    assert call_of(READER.step(chat_seen(chat(("a.txt", "CODE: 7f3"))))) == ("read_file", {"path": "b.txt"})
    done = READER.step(chat_seen(chat(("a.txt", "x\nCODE: 7f3\ny"), ("b.txt", "OWNER = ana"))))
    assert done.message == {"role": "assistant", "content": "FACTS: CODE=7f3, OWNER=ana"}


def test_a_fact_behind_a_memory_brings_the_file_back_by_the_same_call_or_the_rehydration_tool() -> None:
    rounds = (("a.txt", MEMORY), ("b.txt", "OWNER: ana"))
    assert call_of(READER.step(chat_seen(chat(*rounds)))) == ("read_file", {"path": "a.txt"})
    offered = chat(*rounds, tools=[READ_TOOL, REHYDRATE_TOOL])
    assert call_of(READER.step(chat_seen(offered))) == ("gateway_rehydrate", {"artifact_id": "art_0123abcd"})


def test_all_at_once_it_asks_for_every_memory_in_one_call_and_counts_them_brought_back() -> None:
    other = MEMORY.replace("art_0123abcd", "art_4567ef01")
    rounds = (("a.txt", MEMORY), ("b.txt", other))
    offered = chat(*rounds, tools=[READ_TOOL, REHYDRATE_TOOL])
    eager = Reader(all_at_once=True)
    assert call_of(eager.step(chat_seen(offered))) == (
        "gateway_rehydrate", {"artifacts": [{"artifact_id": "art_0123abcd"}, {"artifact_id": "art_4567ef01"}]})
    assert call_of(READER.step(chat_seen(offered))) == ("gateway_rehydrate", {"artifact_id": "art_0123abcd"})
    asked = offered["messages"] + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "g1", "type": "function", "function": {
            "name": "gateway_rehydrate", "arguments": json.dumps({"artifacts": [{"artifact_id": "art_0123abcd"},
                                                                                "artifact:art_4567ef01"]})}}]},
        {"role": "tool", "tool_call_id": "g1", "content": "[gateway_rehydrate: 2 asked, 0 given, 2 refused]"}]
    for reader in (eager, READER):  # both brought back, by either form: nothing left to ask for
        assert reader.step(chat_seen({**offered, "messages": asked})).message["content"] == \
            "FACTS: CODE=unknown, OWNER=unknown"


def test_a_tool_added_mid_conversation_counts_as_offered() -> None:
    addition = {"role": "system", "content": [{"type": "tool_addition", "tool": {
        "type": "tool_definition", "definition": {"name": "gateway_rehydrate", "input_schema": {"type": "object"}}}}]}
    body = {"model": "m", "tools": [{"name": "read_file"}],
            "messages": [{"role": "user", "content": TASK}, addition]}
    assert messages_seen(body).offered == {"read_file", "gateway_rehydrate"}


def test_once_brought_back_and_still_missing_the_fact_is_unknown() -> None:
    again = chat(("a.txt", MEMORY), ("b.txt", "OWNER: ana"), ("a.txt", MEMORY))
    assert READER.step(chat_seen(again)).message["content"] == "FACTS: CODE=unknown, OWNER=ana"
    no_memory = chat(("a.txt", "nothing here"), ("b.txt", "OWNER: ana"))
    assert READER.step(chat_seen(no_memory)).message["content"] == "FACTS: CODE=unknown, OWNER=ana"


def test_the_same_transcript_reads_alike_in_every_format() -> None:
    messages = {"model": "m", "tools": [{"name": "read_file"}], "messages": [
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": MEMORY}]}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "read_file", "input": {"path": "b.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "OWNER: ana"}]}]}
    responses = {"model": "m", "tools": [{"type": "function", "name": "read_file"}], "input": [
        {"role": "user", "content": [{"type": "input_text", "text": TASK}]},
        {"type": "function_call", "call_id": "r1", "name": "read_file", "arguments": '{"path": "a.txt"}'},
        {"type": "function_call_output", "call_id": "r1", "output": MEMORY},
        {"type": "function_call", "call_id": "r2", "name": "read_file", "arguments": '{"path": "b.txt"}'},
        {"type": "function_call_output", "call_id": "r2", "output": "OWNER: ana"}]}
    gemini = {"tools": [{"functionDeclarations": [{"name": "read_file"}]}], "contents": [
        {"role": "user", "parts": [{"text": TASK}]},
        {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"path": "a.txt"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": MEMORY}}}]},
        {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"path": "b.txt"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": "OWNER: ana"}}}]}]}
    for seen in (messages_seen(messages), responses_seen(responses), gemini_seen(gemini)):
        assert call_of(READER.step(seen)) == ("read_file", {"path": "a.txt"}), seen
    assert call_of(READER.step(messages_seen(messages), "toolu_"))[0] == "read_file"
    assert READER.step(messages_seen(messages), "toolu_").message["tool_calls"][0]["id"].startswith("toolu_")


def test_answers_are_deterministic_and_facts_are_read_from_memories_too() -> None:
    body = chat(("a.txt", MEMORY), ("b.txt", "OWNER: ana"))
    assert READER.step(chat_seen(body)).message == READER.step(chat_seen(body)).message
    assert visible_facts(["[compacted ...]\nL31: CODE: 7f3,\n>>>"], ["CODE", "OWNER"]) == {"CODE": "7f3"}


@pytest.fixture(scope="module")
def reader_fake() -> Iterator[FakeUpstream]:
    """A fake of its own playing the reader (the session's shared fake keeps its responders unset)."""
    with FakeUpstream() as fake:
        READER.drive(fake.state)
        yield fake


@pytest.fixture
def fake_reader(reader_fake: FakeUpstream) -> FakeUpstream:
    reader_fake.reset()
    return reader_fake


def test_straight_at_the_fake_it_reads_every_file_and_reports_the_facts(fake_reader: FakeUpstream) -> None:
    fake = fake_reader
    workload = reader_workload(files=3, facts=("CODE", "OWNER"), where="middle", holder=1)
    conversation = run_conversation(fake.api_base, workload)
    assert conversation.reads == list(workload.files)
    assert conversation.answer == workload.answer == "FACTS: CODE=v0-code-q7z0, OWNER=v1-owner-q7z1"


def test_the_command_serves_it_and_refuses_two_modes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fake-upstream", "--reader", "--plain"]) == 2
    assert "give one of --plain, --script and --reader" in capsys.readouterr().err


@pytest.fixture
def gateway(fake_reader: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    """Three tenants: the lossy policy, the same with the rehydration tool, and coding-agent."""
    (tmp_path / "lossy.yaml").write_text(yaml.safe_dump(LOSSY))
    (tmp_path / "lossy-tool.yaml").write_text(yaml.safe_dump({**LOSSY, "rehydration": {"max_rounds": 2}}))
    tenants = [{"id": "lossy", "api_keys": ["sk-lossy"], "policy": "lossy.yaml"},
               {"id": "tool", "api_keys": ["sk-tool"], "policy": "lossy-tool.yaml"},
               {"id": "coder", "api_keys": ["sk-coder"], "policy": "coding-agent"}]
    running, server = start_gateway(settings_for(fake_reader.api_base, sqlite_url, tmp_path, tenants=tenants),
                                    fake_reader)
    yield running
    server.stop()


def _rehydrations(fake: FakeUpstream) -> list[str]:
    return [call["function"]["name"] for r in fake.requests for m in r["body"]["messages"]
            for call in m.get("tool_calls") or [] if call["function"]["name"] == "gateway_rehydrate"]


def test_through_a_lossy_policy_it_reads_the_file_again(gateway: RunningGateway) -> None:
    workload = reader_workload(where="middle")
    conversation = run_conversation(gateway.api_base, workload, key="sk-lossy")
    assert conversation.reads == ["docs/file0.txt", "docs/file1.txt", "docs/file0.txt"]  # the repeated call
    assert conversation.answer == workload.answer
    (before_reread,) = [r["body"] for r in gateway.fake.requests if len(r["body"]["messages"]) == 6]
    assert "[compacted artifact:art_" in before_reread["messages"][3]["content"]
    assert "gateway_rehydrate" not in json.dumps(before_reread["tools"])


def test_with_the_rehydration_tool_it_asks_the_gateway_instead(gateway: RunningGateway) -> None:
    workload = reader_workload(where="middle")
    conversation = run_conversation(gateway.api_base, workload, key="sk-tool")
    assert conversation.reads == ["docs/file0.txt", "docs/file1.txt"] and conversation.answer == workload.answer
    assert _rehydrations(gateway.fake)  # a hidden round the client never saw


def test_coding_agent_keeps_a_first_line_fact_in_its_memory_and_the_model_answers(gateway: RunningGateway) -> None:
    workload = reader_workload(where="first")
    conversation = run_conversation(gateway.api_base, workload, key="sk-coder")
    assert conversation.reads == ["docs/file0.txt", "docs/file1.txt"] and conversation.answer == workload.answer
    last = gateway.fake.last_body()["messages"]
    assert last[3]["content"].startswith("[compacted artifact:art_") and "CODE: v0-code-q7z0" in last[3]["content"]
    assert not _rehydrations(gateway.fake)
