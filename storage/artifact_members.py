"""How many of a conversation's memberships are tool results: on SQLite, a figure kept on its row.

The assembly omits results of sibling branches, and names how many the conversation holds off the
request's path (`IngestResult.sibling_artifacts`). Counting them on every request was a join over
every membership of the conversation after the capture's commit, a cost that grew with it (0.15 ms of
SQLite per request at 100 messages, 0.6 ms at 1,000: bench/statement_times.py). On SQLite a capture,
which holds the conversation's row exclusively (one writer), now adds the tool results whose
membership it inserted (the insert returns the rows it made) to `conversations.artifact_members`.
NULL there is "not counted yet" (a new row, a migrated one, one retention claimed): the capture counts
the conversation once and stores the figure.

PostgreSQL counts as before, in the one statement of the reads after a capture
(storage/conversation_reads.py `_PATH_STATE`): captures of an active conversation only share-lock its
row there, so they could not update it without deadlocking one another.
"""
from __future__ import annotations

from typing import Sequence

from sqlalchemy import Connection, bindparam, func, select, update

from policies.transcript import PathNode
from storage.schema import Conversation, ConversationNode, ToolArtifact

_CONVERSATIONS, _MEMBERS, _ARTIFACTS = Conversation.__table__, ConversationNode.__table__, ToolArtifact.__table__
_COUNTED = _CONVERSATIONS.c.artifact_members
_ALL_ARTIFACT_MEMBERS = (
    select(func.count()).select_from(_MEMBERS)
    .join(_ARTIFACTS, _ARTIFACTS.c.node_id == _MEMBERS.c.node_id)
    .where(_MEMBERS.c.conversation_id == bindparam("conversation"))
)
_ADD = (update(_CONVERSATIONS).where(_CONVERSATIONS.c.id == bindparam("conversation"), _COUNTED.is_not(None))
        .values(artifact_members=_COUNTED + bindparam("added")))
_STORE_FIRST = (update(_CONVERSATIONS).where(_CONVERSATIONS.c.id == bindparam("conversation"), _COUNTED.is_(None))
                .values(artifact_members=bindparam("counted")))


def is_artifact(node: PathNode) -> bool:
    """Whether the capture keeps this message as an artifact (storage/capture.py: the tool results)."""
    return node.message.get("role") == "tool"


def inserted_artifacts(path: Sequence[PathNode], inserted: Sequence[str]) -> int:
    """How many of the memberships inserted (their node ids) are the path's tool results."""
    made = set(inserted)
    return sum(1 for node in path if node.id in made and is_artifact(node))


def artifact_members(connection: Connection, conversation: str, stored: int | None, added: int) -> int:
    """The conversation's artifact memberships once this capture's `added` ones are in, from the figure
    `stored` on its row when the capture took the row's lock (None: not counted yet)."""
    if stored is not None:
        if added:
            connection.execute(_ADD, {"conversation": conversation, "added": added})
        return stored + added
    counted = int(connection.scalar(_ALL_ARTIFACT_MEMBERS, {"conversation": conversation}) or 0)
    connection.execute(_STORE_FIRST, {"conversation": conversation, "counted": counted})
    return counted
