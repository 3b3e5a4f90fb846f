"""The gateway's own compaction item, and the transcript it stands for when it comes back (issue 32).

When the gateway answers a remote compaction itself (gateway/pipeline/compaction.py), the item's
`encrypted_content` is a signed reference: `gwc1.<payload>.<hmac>`, the payload naming the compaction
(its row in `compactions`, storage/compactions.py) and the tenant, the HMAC made with the secret the
dashboard's cookies are signed with (`dashboard.session_secret`; set it when several replicas serve, or
a restart makes every reference issued before it stale). Nothing in it is content.

When a request's input carries such an item, `expanded` puts the transcript the compacted run captured
in its place (read from the store by the run's leaf, as `previous_response_id` is), so the projection
applies to it as to any transcript; the other items are kept as they came, except those before the item
that the transcript holds already (Codex keeps the user's messages beside the item). Only the latest
such item counts (an earlier one is inside the transcript the latest one stands for). A reference this
gateway did not sign, another tenant's, or one whose records are gone is a 400 naming the item.
"""
from __future__ import annotations

import base64
import hmac
import json
from dataclasses import replace
from typing import Any

from gateway.access.dashboard_sessions import SessionSigner
from gateway.errors import InvalidRequest
from gateway.services import Services
from gateway.threads import off_loop
from gateway.wire import NeutralRequest

PREFIX = "gwc1."
_PURPOSE = "compaction"


def reference(signer: SessionSigner, tenant: str, compaction_id: str) -> str:
    payload = base64.urlsafe_b64encode(json.dumps({"c": compaction_id, "t": tenant}).encode()).decode().rstrip("=")
    return f"{PREFIX}{payload}.{signer.mac(_PURPOSE, payload)}"


def _invalid(why: str) -> InvalidRequest:
    return InvalidRequest(f"input: {why}", param="input", code="invalid_compaction")


def read_reference(signer: SessionSigner, content: str, tenant: str) -> str:
    """The compaction id a reference of this tenant names; InvalidRequest if it is forged or another's."""
    payload, _, mac = content[len(PREFIX):].rpartition(".")
    if not payload or not hmac.compare_digest(signer.mac(_PURPOSE, payload), mac):
        raise _invalid("the compaction item was not issued by this gateway")
    try:
        claim = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except ValueError as exc:
        raise _invalid("the compaction item was not issued by this gateway") from exc
    if not isinstance(claim, dict) or claim.get("t") != tenant or not isinstance(claim.get("c"), str):
        raise _invalid("the compaction item belongs to another tenant")
    return claim["c"]


def gateway_item(message: dict[str, Any]) -> dict[str, Any] | None:
    """The gateway's compaction item, when `message` is one (an assistant turn of that item alone)."""
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list) or len(content) != 1:
        return None
    item = content[0]
    if isinstance(item, dict) and item.get("type") == "compaction" \
            and str(item.get("encrypted_content") or "").startswith(PREFIX):
        return item
    return None


def _canonical(message: dict[str, Any]) -> str:
    return json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _is_instructions(message: dict[str, Any]) -> bool:
    return message.get("role") == "system" and "responses_item" not in message


async def expanded(services: Services, tenant: str, neutral: NeutralRequest) -> NeutralRequest:
    """`neutral` with its latest gateway compaction item replaced by the transcript it stands for."""
    # A compaction item is an assistant turn whose content is a list: the type test first spares a
    # 1,000-message transcript of strings a function call per message.
    spots = [index for index, message in enumerate(neutral.messages)
             if type(message.get("content")) is list and gateway_item(message) is not None]
    if not spots:
        return neutral
    last = spots[-1]
    item = gateway_item(neutral.messages[last])
    assert item is not None
    compaction_id = read_reference(services.sessions, item["encrypted_content"], tenant)
    stored = await off_loop(_stored_transcript, services, tenant, compaction_id)
    new = neutral.messages
    head = new[:1] if new and _is_instructions(new[0]) else []
    if stored and _is_instructions(stored[0]):
        stored = stored[1:]  # the compacted request's instructions: this request has its own
    held = {_canonical(message) for message in stored}
    before = [m for m in new[len(head):last] if gateway_item(m) is None and _canonical(m) not in held]
    messages = [*head, *stored, *before, *new[last + 1:]]
    limit = services.settings.server.max_messages
    if len(messages) > limit:
        raise InvalidRequest(f"input: the compacted transcript holds {len(messages)} messages with this input; this"
                             f" gateway takes at most {limit} per request (server.max_messages)", param="input",
                             code="too_many_messages")
    return replace(neutral, messages=messages, digests=None)


def _stored_transcript(services: Services, tenant: str, compaction_id: str) -> list[dict[str, Any]]:
    """The transcript the compaction's run captured (blocking: database reads)."""
    record = services.store.compaction(compaction_id, tenant)
    run = services.store.get_run(record.request_id, tenant) if record is not None else None
    leaf = run.run.get("leaf_node_id") if run is not None else None
    messages = services.store.path_messages(leaf) if leaf else []
    if not messages:
        raise InvalidRequest("input: the compaction item names records this gateway no longer holds (deleted or"
                             " expired); start the conversation again", param="input", code="compaction_not_found")
    return [{k: v for k, v in m.items() if k != "artifact_id"} for m in messages]
