"""An old turn's prose beside its calls reaches the provider as a note, through the real SDKs, while
what must travel byte-exact does: Anthropic's thinking blocks, Responses' reasoning items and item
ids, every call. The latest round keeps its prose, and the run's assembly counts what was cut."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from policies.thoughts import thought_note
from testkit.fake_upstream import FakeUpstream
from testkit.gateway import TENANT_KEY, RunningGateway, dashboard_sign_in
from tests.gateway.wire.test_anthropic_messages import MODEL, anthropic_gateway

POLICY = {"name": "eager-prose", "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 0,
                                                 "clear_at_least_tokens": 0, "min_tokens": 50, "horizon": 1000,
                                                 "thought_min_tokens": 10}}
THOUGHT = ("I will read the next module to find where the build flags are set, then compare them with "
           "the flags the failing target uses before I edit anything.")
OUTPUT = "\n".join(f"{i:5d}  build step {i}: compiled module_{i}.o with 0 warnings" for i in range(150))


@pytest.fixture
def gateway(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    yield from anthropic_gateway(fake, storage_url, tmp_path, POLICY)


def assembly(gateway: RunningGateway, request_id: str) -> dict[str, Any]:
    with gateway.client() as http:
        return http.get(f"/api/requests/{request_id}").json()["assembly"]


def forwarded(gateway: RunningGateway, path: str) -> dict[str, Any]:
    return [r["body"] for r in gateway.fake.requests if r.get("path") == path][-1]


def test_anthropic_thinking_and_tool_use_blocks_stay_while_old_text_becomes_a_note(gateway: RunningGateway) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Why does the build fail?"}]
    turns = []
    for number in range(4):
        thinking = {"type": "thinking", "thinking": f"step {number}: read module {number}",
                    "signature": f"EqQBCkYIBRgC{number}sig=="}
        turn = {"role": "assistant", "content": [
            thinking, {"type": "text", "text": f"{THOUGHT} ({number})"},
            {"type": "tool_use", "id": f"toolu_{number}", "name": "Read", "input": {"file_path": f"m{number}.c"}}]}
        turns.append(turn)
        messages += [turn, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{number}", "content": f"module {number}\n{OUTPUT}"}]}]
    gateway.fake.script(blocks=[{"type": "text", "text": "The flags differ."}])
    sdk = anthropic.Anthropic(base_url=gateway.url, api_key=TENANT_KEY, max_retries=0)
    response = sdk.messages.with_raw_response.create(model=MODEL, max_tokens=64, messages=messages)
    sent = forwarded(gateway, "/v1/messages")["messages"]
    for number, turn in enumerate(turns):
        blocks = sent[1 + 2 * number]["content"]
        assert json.dumps(blocks[0]) == json.dumps(turn["content"][0])  # thinking, signature and all
        assert blocks[2] == turn["content"][2]  # the call
        text = turn["content"][1]["text"]
        assert blocks[1] == ({"type": "text", "text": thought_note(len(text))} if number < 3 else turn["content"][1])
    request_id = response.headers["x-gateway-request-id"]
    assert assembly(gateway, request_id)["omissions"]["assistant_thought"] == 3
    with httpx.Client(base_url=gateway.url, timeout=30) as browser:  # the inspector names the cut
        assert dashboard_sign_in(browser, TENANT_KEY).status_code in (200, 303)
        page = browser.get(f"/dashboard/requests/{request_id}").text
    assert page.count('data-action="thought_compacted"') == 3
    assert f"reasoning: {len(THOUGHT) + 4} chars omitted" in page


def test_responses_reasoning_items_and_message_ids_stay_while_old_text_becomes_a_note(
        gateway: RunningGateway) -> None:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Build all modules."}]
    for number in range(4):
        items += [
            {"type": "reasoning", "id": f"rs_{number}", "summary": [], "encrypted_content": f"gAAAA{number}"},
            {"type": "message", "id": f"msg_{number}", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": f"{THOUGHT} ({number})", "annotations": []}]},
            {"type": "function_call", "id": f"fc_{number}", "call_id": f"call_{number}", "name": "exec_command",
             "arguments": json.dumps({"cmd": f"make module{number}"})},
            {"type": "function_call_output", "call_id": f"call_{number}", "output": f"module {number}\n{OUTPUT}"}]
    gateway.fake.script_message({"role": "assistant", "content": "All built."})
    sdk = openai.OpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)
    raw = sdk.responses.with_raw_response.create(model="fake", input=items)
    sent = forwarded(gateway, "/v1/responses")["input"]
    assert [i.get("id") for i in sent] == [i.get("id") for i in items]  # every item, in its place
    for original, item in zip(items, sent):
        if original.get("type") == "message" and original["id"] != "msg_3":
            text = original["content"][0]["text"]
            assert item == {**original, "content": [
                {"type": "output_text", "text": thought_note(len(text)), "annotations": []}]}
        elif original.get("type") != "function_call_output":
            assert item == original  # reasoning, calls, the latest message, the user's turn
    assert assembly(gateway, raw.headers["x-gateway-request-id"])["omissions"]["assistant_thought"] == 3
