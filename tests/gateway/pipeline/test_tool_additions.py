"""The rehydration tool added mid-conversation on Anthropic upstreams (gateway/pipeline/tool_additions.py).

The fake Anthropic upstream refuses a `tool_addition` without the betas, one
that splits a tool_use turn from its results, and (when told the model lacks
the feature) any at all, with a 400 as Anthropic does.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from gateway.fake_upstream.messages import block_tokens, cache_usage, prompt_blocks, tool_change_refusal
from gateway.pipeline.rehydration import DESCRIPTION, PARAMETERS
from gateway.pipeline.tool_additions import (
    BETAS,
    addition_message,
    as_declared_tools,
    insert_at,
    with_betas,
    without_betas,
)
from testkit.gateway import RunningGateway
from testkit.fake_upstream import FakeUpstream
from tests.gateway.wire.test_anthropic_messages import (
    READ_TOOL,
    _two_reads,
    agent_turn,
    anthropic_gateway,
    assert_valid_anthropic_request,
    read_turns,
    upstream_messages,
)


@pytest.fixture
def gateway(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    yield from anthropic_gateway(fake, storage_url, tmp_path)


TOOL = {"name": "gateway_rehydrate", "description": DESCRIPTION, "input_schema": PARAMETERS}
USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]}
RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}


def test_the_addition_follows_a_result_turn_and_never_splits_a_call_from_its_result() -> None:
    rendered = [{"role": "user", "content": "go"}, USE, RESULT, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "more"}]
    assert insert_at(rendered, 2) == 3  # after the results, before the answer to them
    assert insert_at(rendered, 1) == 1  # before an assistant turn
    assert insert_at([{"role": "user", "content": "go"}, USE, RESULT], 2) == 1  # never last: before the call
    for holder in range(len(rendered)):
        body = {"messages": [*rendered]}
        body["messages"].insert(insert_at(rendered, holder), addition_message(TOOL))
        assert tool_change_refusal(body, ",".join(BETAS), True) is None


def test_betas_join_the_clients_and_leave_with_the_fallback() -> None:
    headers = with_betas({"anthropic-beta": "interleaved-thinking-2025-05-14", "anthropic-version": "2023-06-01"})
    assert headers["anthropic-beta"].split(",") == ["interleaved-thinking-2025-05-14", *BETAS]
    assert with_betas(headers) == headers  # no duplicates
    assert without_betas(headers)["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert "anthropic-beta" not in without_betas(with_betas({}))


def test_the_fallback_declares_the_added_tools_in_tools() -> None:
    body = {"tools": [READ_TOOL], "messages": [USE, RESULT, addition_message(TOOL), {"role": "user", "content": "q"}]}
    declared = as_declared_tools(body)
    assert declared["tools"] == [READ_TOOL, TOOL]
    assert declared["messages"] == [USE, RESULT, {"role": "user", "content": "q"}]
    assert as_declared_tools({**body, "tools": [READ_TOOL, TOOL]})["tools"] == [READ_TOOL, TOOL]


def test_nothing_is_declared_until_a_memory_appears_and_then_it_stays_in_place(gateway: RunningGateway) -> None:
    read_turns(gateway, 4)
    bodies = upstream_messages(gateway)
    headers = [r["headers"] for r in gateway.fake.requests if r.get("path") == "/v1/messages"]
    first, second = bodies[0], bodies[1]  # nothing compacted yet: the client's tools, no addition, no betas
    for body, sent in ((first, headers[0]), (second, headers[1])):
        assert body["tools"] == [READ_TOOL] and all(m["role"] != "system" for m in body["messages"])
        assert "anthropic-beta" not in sent
    compacted = bodies[2:]
    assert compacted, "the eager policy compacts the first file once a later one is read"
    positions = set()
    for body, sent in zip(compacted, headers[2:]):
        assert body["tools"] == [READ_TOOL]
        additions = [i for i, m in enumerate(body["messages"]) if m["role"] == "system"]
        assert len(additions) == 1 and body["messages"][additions[0]] == addition_message(TOOL)
        assert "compacted artifact:" in body["messages"][additions[0] - 1]["content"][0]["content"]
        assert set(BETAS) <= set(sent["anthropic-beta"].split(","))
        assert_valid_anthropic_request(body)
        positions.add(additions[0])
    assert len(positions) == 1  # the same place on every request: the cached prefix before it holds
    # each request extends the one before (markers aside), the addition included
    strip = [[{**m, "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]}
              if isinstance(m["content"], list) else m for m in body["messages"]] for body in compacted]
    for earlier, later in zip(strip, strip[1:]):
        assert later[: len(earlier) - 1] == earlier[:-1]


def test_a_model_without_the_feature_gets_the_tool_in_tools_after_one_refusal(gateway: RunningGateway) -> None:
    gateway.fake.state.tool_changes = False
    messages, artifact = _two_reads(gateway)
    sent = [r for r in gateway.fake.requests if r.get("path") == "/v1/messages"]
    refused = [r for r in sent if any(m["role"] == "system" for m in r["body"]["messages"])]
    assert len(refused) == 1  # asked once, then remembered
    retried = sent[sent.index(refused[0]) + 1]
    assert retried["body"]["tools"] == [READ_TOOL, TOOL]
    assert all(m["role"] != "system" for m in retried["body"]["messages"])
    assert not set(BETAS) & set(retried["headers"].get("anthropic-beta", "").split(","))
    gateway.fake.script(blocks=[{"type": "text", "text": "done"}])
    reply = agent_turn(gateway, messages + [{"role": "assistant", "content": [{"type": "text", "text": "read"}]},
                                            {"role": "user", "content": "and now?"}])
    assert reply.content[0].text == "done"
    last = upstream_messages(gateway)[-1]
    assert last["tools"] == [READ_TOOL, TOOL] and all(m["role"] != "system" for m in last["messages"])
    assert len([r for r in gateway.fake.requests if r.get("path") == "/v1/messages"]) == len(sent) + 1


def test_a_move_reads_from_the_cache_everything_before_what_it_changes(gateway: RunningGateway) -> None:
    """The request before a move put a marker just before the message the move changes first (the
    assembler foresaw it), so the move's request reads the whole unchanged prefix from the cache."""
    read_turns(gateway, 5)
    sent = [r for r in gateway.fake.requests if r.get("path") == "/v1/messages"]
    strip = [[{k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b
              for b in prompt_blocks(r["body"])] for r in sent]
    moves = 0
    for index in range(1, len(sent)):
        before, now = strip[index - 1], strip[index]
        same = next((n for n, (a, b) in enumerate(zip(before, now)) if a != b), None)
        if same is None:
            continue
        moves += 1
        usage = cache_usage(sent[index]["body"], set())  # what a cold cache would write: the tokens per block
        assert usage["cache_read_input_tokens"] == 0
        # replay the provider's cache up to this request, then price it
        written: set[str] = set()
        for earlier in sent[:index]:
            cache_usage(earlier["body"], written)
        read = cache_usage(sent[index]["body"], written)["cache_read_input_tokens"]
        assert read == sum(block_tokens(b) for b in now[:same]), (index, same)
    assert moves >= 2


def test_a_streamed_request_falls_back_too(gateway: RunningGateway) -> None:
    gateway.fake.state.tool_changes = False
    messages = read_turns(gateway, 2)
    gateway.fake.script(blocks=[{"type": "text", "text": "streamed after the fallback"}])
    reply = agent_turn(gateway, messages, stream=True)
    assert reply.content[-1].text == "streamed after the fallback" and reply.stop_reason == "end_turn"
    refused, retried = [r for r in gateway.fake.requests if r.get("path") == "/v1/messages"][-2:]
    assert any(m["role"] == "system" for m in refused["body"]["messages"]) and refused["body"]["stream"]
    assert retried["body"]["tools"] == [READ_TOOL, TOOL] and retried["body"]["stream"]
    assert all(m["role"] != "system" for m in retried["body"]["messages"])
