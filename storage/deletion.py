"""Deleting a conversation, and collecting the blobs no artifact names any more.

A conversation is what users delete. Its runs and their assemblies go; so do
the message nodes (with their tool calls and artifacts) that no other
conversation uses. Conversations that begin alike share nodes, so a node stays
while any conversation still uses it.

Blob files are shared by content across tenants. Their lifecycle is guarded by
the `blobs` registry row of each file: capture upserts the row (which locks it
until capture commits) before it writes or verifies the file; collection
deletes the row (taking the same lock), checks that no artifact names the key,
and only then removes the file, before it commits. Whatever the interleaving,
a file goes only while no capture that relies on it is in flight, and a
capture that comes after writes the file anew. A key whose row is missing is
never touched.
"""
from __future__ import annotations

from typing import Iterable

from sqlalchemy import Connection, delete, exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from policies.transcript import label_conversation_id
from storage.schema import (
    Blob, Compaction, ContextAssembly, Conversation, ConversationNode, ForwardedMessage, MessageNode, ModelRun,
    ToolArtifact, ToolCall,
)
from storage.store_base import StoreBase

DELETE_ATTEMPTS = 3
_CHUNK = 500


def _chunks(items: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


class Deletion(StoreBase):
    def delete_conversation(self, tenant: str, key: str) -> dict[str, int]:
        """Delete one conversation of `tenant`, named by its id or its session label.

        Returns the rows deleted, by table, and the blob files removed; {} if the
        tenant has no such conversation.
        """
        for attempt in range(1, DELETE_ATTEMPTS + 1):
            try:
                counts, blob_keys = self._delete_conversation(tenant, key)
                break
            except IntegrityError:
                # A request captured meanwhile now shares one of the nodes: decide again.
                if attempt == DELETE_ATTEMPTS:
                    raise
        if not counts:
            return {}
        counts["blobs"] = self.collect_blobs(blob_keys)
        return counts

    def _delete_conversation(self, tenant: str, key: str) -> tuple[dict[str, int], set[str]]:
        candidates = {key, label_conversation_id(tenant, key)}  # an id, or the id a label names
        with Session(self.engine) as session, session.begin():
            conversations = set(session.scalars(
                select(ModelRun.conversation_id).where(ModelRun.tenant == tenant,
                                                       ModelRun.conversation_id.in_(candidates)).distinct()
            ))
            conversations.update(session.scalars(  # its runs may have gone before it (retention)
                select(Conversation.id).where(Conversation.tenant == tenant, Conversation.id.in_(candidates))))
            if not conversations:
                return {}, set()
            runs = select(ModelRun.id).where(ModelRun.tenant == tenant, ModelRun.conversation_id.in_(conversations))
            counts = {"context_assemblies": session.execute(
                delete(ContextAssembly).where(ContextAssembly.request_id.in_(runs))).rowcount}
            counts["model_runs"] = session.execute(
                delete(ModelRun).where(ModelRun.tenant == tenant, ModelRun.conversation_id.in_(conversations))
            ).rowcount
            session.execute(delete(Conversation).where(Conversation.tenant == tenant, Conversation.id.in_(conversations)))
            counts["compactions"] = session.execute(delete(Compaction).where(
                Compaction.tenant == tenant, Compaction.conversation_id.in_(conversations))).rowcount
            counts["forwarded_messages"] = session.execute(delete(ForwardedMessage).where(
                ForwardedMessage.tenant == tenant, ForwardedMessage.conversation_id.in_(conversations))).rowcount
            transcript, blob_keys = self._delete_transcripts(session, tenant, list(conversations))
            transcript.pop("conversation_nodes")
            counts |= transcript
        return counts, blob_keys

    def _delete_transcripts(self, executor: Session | Connection, tenant: str,
                            conversations: list[str]) -> tuple[dict[str, int], set[str]]:
        """The conversations' node memberships, and their nodes no other conversation uses with
        those nodes' tool calls and artifacts: (rows deleted by table, the blob keys they named)."""
        nodes = list(executor.scalars(
            select(ConversationNode.node_id).where(ConversationNode.conversation_id.in_(conversations))))
        shared: set[str] = set()
        for chunk in _chunks(nodes):
            shared.update(executor.scalars(select(ConversationNode.node_id).where(
                ConversationNode.node_id.in_(chunk), ConversationNode.conversation_id.not_in(conversations))))
        counts = {"conversation_nodes": executor.execute(
            delete(ConversationNode).where(ConversationNode.conversation_id.in_(conversations))).rowcount}
        counts |= {"tool_artifacts": 0, "tool_calls": 0, "message_nodes": 0}
        blob_keys: set[str] = set()
        for chunk in _chunks([n for n in nodes if n not in shared]):
            blob_keys.update(executor.scalars(select(ToolArtifact.blob_key).where(
                ToolArtifact.node_id.in_(chunk), ToolArtifact.blob_key.is_not(None))))
            for model, column in ((ToolArtifact, ToolArtifact.node_id), (ToolCall, ToolCall.node_id),
                                  (MessageNode, MessageNode.id)):
                counts[model.__tablename__] += executor.execute(
                    delete(model).where(model.tenant == tenant, column.in_(chunk))).rowcount
        return counts, blob_keys

    def forget_response(self, tenant: str, request_id: str) -> bool:
        """Drop the answer recorded for a run (DELETE /v1/responses/{id}); the run's accounting stays."""
        with Session(self.engine) as session, session.begin():
            return bool(session.execute(
                update(ModelRun).where(ModelRun.id == request_id, ModelRun.tenant == tenant,
                                       ModelRun.response_json.is_not(None)).values(response_json=None)
            ).rowcount)

    def collect_blobs(self, keys: Iterable[str]) -> int:
        """Remove the files of `keys` that no artifact names; the number removed."""
        removed = 0
        for key in sorted(set(keys)):
            with Session(self.engine) as session:
                transaction = session.begin()
                try:
                    locked = session.execute(delete(Blob).where(Blob.key == key)).rowcount
                    named = session.scalar(select(exists().where(ToolArtifact.blob_key == key)))
                    if not locked or named:
                        transaction.rollback()
                        continue
                    removed += self.blobs.delete(key)  # under the lock, before the commit
                    transaction.commit()
                except BaseException:
                    transaction.rollback()
                    raise
        return removed

    def collect_unreferenced_blobs(self, limit: int = 1000) -> int:
        """Collect up to `limit` registered blobs that no artifact names (left by a crash mid-deletion)."""
        with Session(self.engine) as session:
            keys = list(session.scalars(
                select(Blob.key).where(~exists().where(ToolArtifact.blob_key == Blob.key)).limit(limit)))
        return self.collect_blobs(keys)
