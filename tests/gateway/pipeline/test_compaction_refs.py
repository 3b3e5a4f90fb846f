"""The gateway's compaction references and the Responses parse of compaction items (units, no server)."""
from __future__ import annotations

import json

import pytest

from gateway.access.dashboard_sessions import SessionSigner
from gateway.errors import InvalidRequest
from gateway.pipeline.compaction_refs import PREFIX, gateway_item, read_reference, reference
from gateway.wire.openai_responses import OPENAI_RESPONSES, OPENAI_RESPONSES_COMPACT, from_neutral

SIGNER = SessionSigner("s3cret")


def test_a_reference_names_its_compaction_for_its_tenant_only() -> None:
    content = reference(SIGNER, "acme", "cmp_1")
    assert content.startswith(PREFIX)
    assert read_reference(SIGNER, content, "acme") == "cmp_1"
    with pytest.raises(InvalidRequest, match="another tenant"):
        read_reference(SIGNER, content, "globex")
    with pytest.raises(InvalidRequest, match="not issued by this gateway"):
        read_reference(SessionSigner("other"), content, "acme")  # another gateway's secret
    payload, mac = content[len(PREFIX):].rsplit(".", 1)
    other = reference(SIGNER, "globex", "cmp_2")[len(PREFIX):].rsplit(".", 1)[0]
    for forged in (f"{PREFIX}{other}.{mac}", f"{PREFIX}{payload}x.{mac}", f"{PREFIX}{payload}", PREFIX):
        with pytest.raises(InvalidRequest) as caught:
            read_reference(SIGNER, forged, "acme")
        assert caught.value.code == "invalid_compaction" and caught.value.param == "input"


def test_the_parse_takes_the_trigger_off_and_keeps_a_compaction_item_as_a_turn_of_its_own() -> None:
    ours = {"type": "compaction", "id": "cmp_1", "encrypted_content": reference(SIGNER, "acme", "cmp_1")}
    theirs = {"type": "compaction", "id": "cmp_2", "encrypted_content": "opaque"}
    call = {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"}
    items = [{"type": "message", "role": "user", "content": "hi"}, ours, call,
             {"type": "function_call_output", "call_id": "c1", "output": "ok"}, theirs,
             {"type": "compaction_trigger"}]
    neutral = OPENAI_RESPONSES.parse(json.dumps({"model": "m", "input": items, "stream": True}).encode())
    assert neutral.compaction == "responses" and neutral.stream
    assert [gateway_item(m) for m in neutral.messages] == [None, ours, None, None, None]
    assert neutral.messages[2]["content"] == [call] and neutral.messages[4]["content"] == [theirs]
    assert from_neutral(neutral.messages, top_instructions=False) == items[:-1]  # the items as they came
    plain = OPENAI_RESPONSES.parse(json.dumps({"model": "m", "input": items[:1]}).encode())
    assert plain.compaction is None


def test_the_compact_endpoint_is_never_streamed_and_needs_input() -> None:
    neutral = OPENAI_RESPONSES_COMPACT.parse(b'{"model": "m", "input": "hello", "stream": true}')
    assert neutral.compaction == "responses/compact" and not neutral.stream
    assert neutral.messages == [{"role": "user", "content": "hello", "responses_item": {"type": "message",
                                                                                        "role": "user"}}]
    with pytest.raises(InvalidRequest) as caught:
        OPENAI_RESPONSES_COMPACT.parse(b'{"model": "m"}')
    assert caught.value.param == "input"
