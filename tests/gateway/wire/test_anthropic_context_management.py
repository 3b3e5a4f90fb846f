"""Anthropic's context management through the gateway (issue 32): a client's `context_management` and its
beta header reach the provider as sent, the provider's `applied_edits` are on the run record and in the
inspector, compaction blocks pass byte for byte, a malformed field is a 400 in Anthropic's error shape,
and a deployment LiteLLM adapts takes only the edits its adapter applies by itself.

The provider is the fake's `/v1/messages`, which applies the edits (gateway/fake_upstream/context_edits.py).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import pytest

from testkit.fake_upstream import FakeUpstream
from testkit.gateway import TENANT_KEY, RunningGateway, dashboard_sign_in
from tests.gateway.wire.test_anthropic_messages import MODEL, anthropic_gateway, record, upstream_messages

BETAS = "interleaved-thinking-2025-05-14,context-management-2025-06-27"  # not in sorted order, as Claude Code may
EDITS = {"edits": [
    {"type": "clear_thinking_20251015", "keep": "all"},
    {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2},
     "keep": {"type": "tool_uses", "value": 1}, "clear_at_least": {"type": "input_tokens", "value": 10},
     "exclude_tools": ["Write"], "clear_tool_inputs": False}]}


@pytest.fixture
def gateway(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    yield from anthropic_gateway(fake, storage_url, tmp_path)


def reads(count: int) -> list[dict[str, Any]]:
    """A transcript of `count` Read calls, each answered with a file."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the modules."}]
    for n in range(count):
        messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{n:02d}", "name": "Read",
                                                        "input": {"file_path": f"/m{n}.py"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n:02d}",
                                                   "content": f"# module {n}\n" + "def f(x): return x\n" * 40}]}]
    return messages


def post(gateway: RunningGateway, body: dict[str, Any], betas: str | None = BETAS) -> httpx.Response:
    headers = {"x-api-key": TENANT_KEY, **({"anthropic-beta": betas} if betas else {})}
    return httpx.post(f"{gateway.url}/v1/messages", json=body, headers=headers, timeout=60)


def streamed_message(text: str) -> dict[str, Any]:
    """The message_delta's context_management and the content blocks of a streamed answer."""
    out: dict[str, Any] = {"blocks": {}, "deltas": []}
    for frame in text.split("\n\n"):
        data = "".join(line[5:].strip() for line in frame.splitlines() if line.startswith("data:"))
        event = json.loads(data) if data else {}
        if event.get("type") == "message_delta":
            out["managed"] = event.get("context_management")
        elif event.get("type") == "content_block_start":
            out["blocks"][event["index"]] = event["content_block"]
        elif event.get("type") == "content_block_delta":
            out["deltas"].append(event["delta"])
    return out


def test_a_claude_code_style_request_reaches_the_provider_as_sent(gateway: RunningGateway) -> None:
    """The SDK's beta call, as Claude Code makes it: the field and the beta header arrive unchanged, and
    the provider's applied edits are on the answer, the run record and the inspector."""
    sdk = anthropic.Anthropic(base_url=gateway.url, api_key=TENANT_KEY, max_retries=0)
    raw = sdk.beta.messages.with_raw_response.create(
        model=MODEL, max_tokens=256, messages=reads(4), context_management=EDITS,
        betas=["interleaved-thinking-2025-05-14", "context-management-2025-06-27"])
    answer = raw.parse()
    sent = upstream_messages(gateway)[-1]
    assert json.dumps(sent["context_management"]) == json.dumps(EDITS)
    assert gateway.fake.requests[-1]["headers"]["anthropic-beta"] == BETAS
    applied = [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 3,
                "cleared_input_tokens": answer.context_management.applied_edits[0].cleared_input_tokens}]
    assert [e.model_dump() for e in answer.context_management.applied_edits] == applied
    run = record(gateway, raw.headers["x-gateway-request-id"])
    assert run["assembly"]["context_management"] == {"edits": EDITS["edits"], "applied_edits": applied}
    assert run["response"]["context_management"] == {"applied_edits": applied}
    with httpx.Client(base_url=gateway.url, timeout=30) as browser:
        assert dashboard_sign_in(browser, TENANT_KEY).status_code in (200, 303)
        page = browser.get(f"/dashboard/requests/{raw.headers['x-gateway-request-id']}").text
    assert 'id="context-management"' in page and 'data-edit="clear_thinking_20251015"' in page
    assert 'data-applied="clear_tool_uses_20250919"' in page and "3 tool uses" in page
    assert f"{applied[0]['cleared_input_tokens']} input tokens cleared" in page


def test_a_stream_tells_the_applied_edits_and_records_them(gateway: RunningGateway) -> None:
    response = post(gateway, {"model": MODEL, "max_tokens": 256, "messages": reads(4), "context_management": EDITS,
                              "stream": True})
    assert response.status_code == 200, response.text
    assert json.dumps(upstream_messages(gateway)[-1]["context_management"]) == json.dumps(EDITS)
    assert gateway.fake.requests[-1]["headers"]["anthropic-beta"] == BETAS
    managed = streamed_message(response.text)["managed"]
    assert managed["applied_edits"][0]["cleared_tool_uses"] == 3
    run = record(gateway, response.headers["x-gateway-request-id"])
    assert run["assembly"]["context_management"]["applied_edits"] == managed["applied_edits"]
    assert run["response"]["context_management"] == managed


def test_a_request_without_context_management_records_none(gateway: RunningGateway) -> None:
    response = post(gateway, {"model": MODEL, "max_tokens": 64, "messages": reads(2)}, betas=None)
    assert response.status_code == 200, response.text
    assert "context_management" not in upstream_messages(gateway)[-1] and "context_management" not in response.json()
    assert record(gateway, response.headers["x-gateway-request-id"])["assembly"]["context_management"] is None


COMPACTION = {"type": "compaction", "content": "Summary: read modules 0 to 9; each defines f.",
              "encrypted_content": "EuYBCkYIBRgCKkA+opaque/bytes=="}


def test_compaction_blocks_pass_byte_for_byte(gateway: RunningGateway) -> None:
    """A compaction block in the transcript is forwarded as it came, and one in a streamed answer reaches
    the client and the record whole."""
    messages = [{"role": "user", "content": "Go on."},
                {"role": "assistant", "content": [COMPACTION, {"type": "text", "text": "Continuing."}]},
                *reads(3)[1:]]
    gateway.fake.script(blocks=[dict(COMPACTION), {"type": "text", "text": "Compacted."}])
    response = post(gateway, {"model": MODEL, "max_tokens": 64, "messages": messages, "stream": True,
                              "context_management": {"edits": [{"type": "compact_20260112"}]}},
                    betas="compact-2026-01-12,context-management-2025-06-27")
    forwarded = upstream_messages(gateway)[-1]["messages"][1]["content"][0]
    assert json.dumps(forwarded) == json.dumps(COMPACTION)
    assert response.status_code == 200, response.text
    streamed = streamed_message(response.text)
    assert streamed["blocks"][0]["type"] == "compaction"
    assert {"type": "compaction_delta", "content": COMPACTION["content"],
            "encrypted_content": COMPACTION["encrypted_content"]} in streamed["deltas"]
    run = record(gateway, response.headers["x-gateway-request-id"])
    assert run["response"]["content"][0] == COMPACTION


HOSTILE = [
    ("a string", "context_management"),
    ({"edits": "clear everything"}, "context_management.edits"),
    ({"edits": [{"type": 7}]}, "context_management.edits[0]"),
    ({"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": "lots"}}]},
     "context_management.edits[0].trigger.value"),
    ({"edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "input_tokens", "value": 3}}]},
     "context_management.edits[0].keep.type"),
    ({"edits": [{"type": "clear_tool_uses_20250919", "clear_at_least": {"type": "input_tokens", "value": -1}}]},
     "context_management.edits[0].clear_at_least.value"),
    ({"edits": [{"type": "clear_tool_uses_20250919", "exclude_tools": ["Read", 3]}]},
     "context_management.edits[0].exclude_tools"),
    ({"edits": [{"type": "clear_tool_uses_20250919", "clear_tool_inputs": "yes"}]},
     "context_management.edits[0].clear_tool_inputs"),
    ({"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": True}}]},
     "context_management.edits[0].keep.value"),
]


@pytest.mark.parametrize(("value", "param"), HOSTILE)
def test_a_malformed_context_management_is_a_400_in_anthropics_shape(gateway: RunningGateway, value: Any,
                                                                      param: str) -> None:
    before = len(gateway.fake.requests)
    response = post(gateway, {"model": MODEL, "max_tokens": 64, "messages": reads(1), "context_management": value})
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(f"{param}:"), body
    assert len(gateway.fake.requests) == before


def test_an_adapted_deployment_applies_what_litellms_adapter_applies(gateway: RunningGateway) -> None:
    """To a model LiteLLM adapts (Chat Completions here), clearing tool uses is applied by LiteLLM's adapter
    and reported; an edit only Anthropic applies is a 400 naming it, and nothing is sent."""
    response = post(gateway, {"model": "fake", "max_tokens": 64, "messages": reads(4), "context_management": EDITS})
    assert response.status_code == 200, response.text
    chat = gateway.fake.requests[-1]["body"]["messages"]
    results = [m["content"] for m in chat if m["role"] == "tool"]
    assert results[-1].startswith("# module 3") and all("Cleared" in r for r in results[:-1])
    applied = response.json()["context_management"]["applied_edits"]
    assert applied[0]["type"] == "clear_tool_uses_20250919" and applied[0]["cleared_tool_uses"] == 3
    run = record(gateway, response.headers["x-gateway-request-id"])
    assert run["assembly"]["context_management"] == {"edits": EDITS["edits"], "applied_edits": applied}
    before = len(gateway.fake.requests)
    refused = post(gateway, {"model": "fake", "max_tokens": 64, "messages": reads(1),
                             "context_management": {"edits": [EDITS["edits"][0], {"type": "compact_20260112"}]}})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["message"].startswith("context_management.edits[1]: the edit compact_20260112")
    assert len(gateway.fake.requests) == before
