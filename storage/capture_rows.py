"""The rows a capture writes for a path's nodes (storage/capture.py), built from the path alone.

Which of a path's nodes are new is known only in the capture's transaction, under the conversation's
row lock (on SQLite, the write lock: one writer, so what is done under it bounds throughput). The
rows of the nodes likely new are built before it (`CaptureRows._prepare`): their canonical JSON,
seals, digests and token counts (bench/capture_path.py prints how long a capture holds the lock).
"""
from __future__ import annotations

import hashlib
import json
from datetime import datetime
from functools import cached_property
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from policies.bounded_cache import BoundedCache
from policies.canonical import fast_canonical_json
from policies.tokens import count_text
from policies.tool_status import message_status
from policies.transcript import (
    PathNode,
    artifact_id_for,
    conversation_id_for,
    first_user_node,
    tool_call_pk,
    tool_result_bytes,
)
from storage.encryption import artifact_aad, artifact_arguments_aad, node_aad
from storage.record_types import RunStart
from storage.store_base import StoreBase

# call id -> (assistant node, call, author): a result belongs to whoever made the call
_OpenCalls = Mapping[str, tuple[str, Mapping[str, Any], "str | None"]]
# a node's row, and for a tool message its artifact's row and raw bytes (`CaptureRows._node_rows`)
_NodeRows = tuple[dict[str, Any], "dict[str, Any] | None", bytes]
CAPTURED_LEAVES = 4096  # the leaves `CaptureRows._captured_leaves` holds: about 1 MB with their ids (tracemalloc)
# The most nodes `CaptureRows._prepare` builds rows for: a path new to this process (a restart, a conversation
# another replica captured) may be stored already, and rows built for stored nodes are work thrown away.
PREPARED_MOST = 64


class Prepared(NamedTuple):
    """What `CaptureRows._prepare` worked out before the capture's transaction."""

    tree_id: str
    conversation: str
    now: datetime
    opening_node: str | None
    rows: dict[str, _NodeRows]  # by node id: the rows of the nodes likely new


def _open_calls(assistant: PathNode | None) -> _OpenCalls:
    """The calls of an assistant message (none without one), which the results after it answer."""
    if assistant is None:
        return {}
    author = assistant.message.get("name")
    return {str(c.get("id")): (assistant.id, c, author) for c in assistant.message.get("tool_calls") or []}


class CaptureRows(StoreBase):
    @cached_property
    def _captured_leaves(self) -> BoundedCache:
        """The last nodes of paths this process captured: every node up to one of them is stored (a
        node's id names its parent, and a capture stores a path whole), unless deleted since."""
        return BoundedCache(CAPTURED_LEAVES)

    def _prepare(self, path: Sequence[PathNode], run: RunStart) -> Prepared:
        """What a capture works out from the path alone, before its transaction (on SQLite, before the
        write lock: what is done under it bounds throughput): the conversation, the moment, and the
        rows of the nodes likely new, those past the last node of a path this process captured (an
        agent's request adds a round or two), at most `PREPARED_MOST` of them. Which nodes are new is
        known only under the lock: rows built here for nodes found stored are not used, and those of
        new nodes not built here are built there."""
        tenant, tree_id, now = run.tenant, path[0].id, self._now()
        unseen, least = len(path), max(0, len(path) - PREPARED_MOST)
        while unseen > least and self._captured_leaves.get(path[unseen - 1].id) is None:
            unseen -= 1
        likely_new = {n.id for n in path[unseen:]}
        opening = first_user_node(path)
        return Prepared(tree_id, conversation_id_for(tenant, run.session_label, path, run.request_id), now,
                         opening.id if opening else None,
                         self._new_rows(tenant, tree_id, path, likely_new.__contains__, run, now))

    def _new_rows(self, tenant: str, tree_id: str, path: Sequence[PathNode], wanted: Callable[[str], bool],
                  run: RunStart, now: datetime) -> dict[str, _NodeRows]:
        """The rows of the path's nodes whose ids `wanted` takes, each with the calls open where it stands."""
        rows: dict[str, _NodeRows] = {}
        asked: PathNode | None = None  # the latest assistant message so far, whose calls are open
        open_calls: _OpenCalls = {}
        calls_of: PathNode | None = None  # whose calls `open_calls` holds (worked out for wanted nodes only)
        for node in path:
            if node.message.get("role") == "assistant":
                asked = node
            if not wanted(node.id):
                continue
            if asked is not calls_of:
                open_calls, calls_of = _open_calls(asked), asked
            rows[node.id] = self._node_rows(tenant, tree_id, node, open_calls, run, now)
        return rows

    def _node_rows(
        self,
        tenant: str,
        tree_id: str,
        node: PathNode,
        calls: _OpenCalls,
        run: RunStart,
        now: datetime,
    ) -> _NodeRows:
        """The node's row, and for a tool message its artifact's row and raw bytes."""
        message = dict(node.message)
        role = str(message.get("role"))
        artifact = None
        artifact_id = None
        raw = b""
        if role == "tool":
            artifact_id = artifact_id_for(node.id)
            artifact, raw = self._artifact_row(tenant, tree_id, node, artifact_id, calls, run, now)
            message.pop("content", None)  # the artifact holds it, byte-exact
        row = {
            "id": node.id,
            "tenant": tenant,
            "parent_id": node.parent_id,
            "session_id": tree_id,  # the column of the tree
            "depth": node.position,
            "role": role,
            "message_json": self.encryption.seal_text(fast_canonical_json(message), node_aad(node.id)),
            "key_id": self.encryption.current_id,
            "artifact_id": artifact_id,
            "first_request_id": run.request_id,
            "created_at": now,
        }
        return row, artifact, raw

    def _artifact_row(
        self,
        tenant: str,
        tree_id: str,
        node: PathNode,
        artifact_id: str,
        calls: _OpenCalls,
        run: RunStart,
        now: datetime,
    ) -> tuple[dict[str, Any], bytes]:
        content = node.message.get("content")
        original, redacted = None, None
        if run.redact is not None:  # stored redacted: the artifact is what is stored, the original's hash kept
            content, redacted = run.redact(content)
            if redacted:
                original = hashlib.sha256(tool_result_bytes(node.message.get("content"))[0]).hexdigest()
        raw, content_type = tool_result_bytes(content)
        text_content = raw.decode("utf-8", "replace")
        call_id = str(node.message.get("tool_call_id") or "")
        call_node_id, call, author = calls.get(call_id, (None, {}, None))
        function = call.get("function") or {}
        digest = hashlib.sha256(raw).hexdigest()
        large = len(raw) > self.inline_max_bytes
        row = {
            "id": artifact_id,
            "tenant": tenant,
            "node_id": node.id,
            "session_id": tree_id,  # the column of the tree
            "tool_call_id": call_id,
            "tool_call_pk": tool_call_pk(call_node_id, call_id) if call_node_id else None,
            "tool_name": function.get("name"),
            "arguments": self.encryption.seal_text(function.get("arguments"), artifact_arguments_aad(artifact_id)),
            "status": message_status(dict(node.message), text_content),
            "sha256": digest,
            "size_bytes": len(raw),
            "tokens": count_text(text_content),
            "content_type": content_type,
            "content": None if large else raw,
            "key_id": self.encryption.current_id,
            "blob_key": digest if large else None,  # blobs are named by their sha256
            "owner_participant": author or run.participant,
            "privacy_class": None,
            "freshness_class": None,
            "captured_by_request": run.request_id,
            "observed_at": now,
            "original_sha256": original,
            "redacted_json": json.dumps(dict(redacted), sort_keys=True) if redacted else None,
        }
        if not large and self.encryption.enabled:  # a blob is sealed as it is written (_write_blobs)
            row["content"] = self.encryption.seal(raw, artifact_aad(digest))
        return row, raw

