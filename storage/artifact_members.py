"""How many of a conversation's memberships are tool results: on SQLite, a figure kept on its row.

The assembly omits results of sibling branches, and names how many the conversation holds off the
request's path (`IngestResult.sibling_artifacts`). Counting them on every request was a join over
every membership of the conversation after the capture's commit, a cost that grew with it (0.15 ms of
SQLite per request at 100 messages, 0.6 ms at 1,000: bench/statement_times.py). On SQLite a capture,
which holds the conversation's row exclusively (one writer), now adds the tool results whose
membership it inserted (the insert returns the rows it made) to `conversations.artifact_members`.
NULL there is "not counted yet" (a new row, a migrated one, one retention claimed): the capture counts
the conversation once and stores the figure.

On PostgreSQL captures of an active conversation only share-lock its row (storage/capture.py
`_hold_conversation`), so they cannot update it: two that both asked to upgrade their lock would
deadlock. Counting with the join there took 2.2 of the 2.5 ms of the statement after a capture at
1,000 messages (bench/statement_times.py --explain). Such a capture leaves a row in
`conversation_member_deltas` with what it added instead, in the very statement that inserts the
memberships (a batch cannot read what an insert returns), and the conversation holds its figure plus
what its rows add, read in the statement after the capture (storage/conversation_reads.py). A capture
that holds the row exclusively (a conversation new, idle or not counted yet: a share lock is taken
only on a counted one) folds the rows into the figure, counting with the join when there is none; one
that finds many rows gathers them into one, skipping rows another capture is gathering, so no
capture waits for another. Every capture locks the conversation's row before its delta rows, and only
an exclusive holder deletes them all: no two captures wait on each other in a cycle.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from sqlalchemy import Connection, String, bindparam, func, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY

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

# PostgreSQL. The join of a conversation's memberships with the artifacts, as SQL (`_FOLD` counts it;
# `POSTGRESQL_COUNTED` falls back to it, bounded).
_JOINED = ("FROM conversation_nodes JOIN tool_artifacts ON tool_artifacts.node_id = conversation_nodes.node_id"
           " WHERE conversation_nodes.conversation_id = CAST(:conversation AS VARCHAR)")
_JOIN_COUNT = f"SELECT count(*) {_JOINED}"
# The memberships inserted, in the path's order, and a row with how many of those it made are tool results.
_JOIN_RECORDING_ADDED = text(
    "WITH joined AS (INSERT INTO conversation_nodes (conversation_id, node_id)"
    "  SELECT CAST(:conversation AS VARCHAR), node.id FROM unnest(:nodes) WITH ORDINALITY AS node(id, n)"
    "  ORDER BY node.n ON CONFLICT DO NOTHING RETURNING node_id)"
    " INSERT INTO conversation_member_deltas (conversation_id, added)"
    " SELECT CAST(:conversation AS VARCHAR), count(*) FROM joined WHERE node_id = ANY(:artifacts)"
    " HAVING count(*) > 0"
).bindparams(bindparam("nodes", type_=ARRAY(String)), bindparam("artifacts", type_=ARRAY(String)))
# Under the row's exclusive lock: the rows folded into the figure, or the figure counted (none yet).
_FOLD = text(
    "WITH gone AS (DELETE FROM conversation_member_deltas WHERE conversation_id = CAST(:conversation AS VARCHAR)"
    "  RETURNING added)"
    " UPDATE conversations SET artifact_members = CASE WHEN conversations.artifact_members IS NULL"
    f"  THEN ({_JOIN_COUNT})"
    "  ELSE conversations.artifact_members + (SELECT coalesce(sum(added), 0) FROM gone) END"
    " WHERE conversations.id = CAST(:conversation AS VARCHAR)")
# Under a share lock: the rows no other capture is gathering, gathered into one.
_GATHER = text(
    "WITH gone AS (DELETE FROM conversation_member_deltas WHERE id IN (SELECT id FROM conversation_member_deltas"
    "  WHERE conversation_id = CAST(:conversation AS VARCHAR) FOR UPDATE SKIP LOCKED) RETURNING added)"
    " INSERT INTO conversation_member_deltas (conversation_id, added)"
    " SELECT CAST(:conversation AS VARCHAR), sum(added) FROM gone HAVING count(*) > 0")
# What the statement after a capture selects: (the conversation's tool results, up to :bound when it has
# no figure, as the join gives them; how many delta rows it has), from `POSTGRESQL_DELTAS`.
POSTGRESQL_COUNTED = (
    "coalesce((SELECT artifact_members FROM conversations WHERE id = CAST(:conversation AS VARCHAR))"
    " + conversation_deltas.added,"
    f" (SELECT count(*) FROM (SELECT conversation_nodes.node_id {_JOINED} LIMIT :bound) AS members)),"
    " conversation_deltas.rows")
POSTGRESQL_DELTAS = ("(SELECT coalesce(sum(added), 0) AS added, count(*) AS rows FROM conversation_member_deltas"
                     " WHERE conversation_id = CAST(:conversation AS VARCHAR)) AS conversation_deltas")
GATHER_ROWS = 32  # a conversation's delta rows beyond which a capture gathers them into one


def is_artifact(node: PathNode) -> bool:
    """Whether the capture keeps this message as an artifact (storage/capture.py: the tool results)."""
    return node.message.get("role") == "tool"


def inserted_artifacts(path: Sequence[PathNode], inserted: Sequence[str]) -> int:
    """How many of the memberships inserted (their node ids) are the path's tool results."""
    made = set(inserted)
    return sum(1 for node in path if node.id in made and is_artifact(node))


def artifact_members(execute: Callable[[Any, Mapping[str, Any]], list[Any]], conversation: str,
                     stored: int | None, added: int) -> int:
    """The conversation's artifact memberships once this capture's `added` ones are in, from the figure
    `stored` on its row when the capture took the row's lock (None: not counted yet); `execute`: the
    store's, on the capture's connection."""
    if stored is not None:
        if added:
            execute(_ADD, {"conversation": conversation, "added": added})
        return stored + added
    counted = int(execute(_ALL_ARTIFACT_MEMBERS, {"conversation": conversation})[0][0] or 0)
    execute(_STORE_FIRST, {"conversation": conversation, "counted": counted})
    return counted


def join_counting(connection: Connection, conversation: str, joining: Sequence[PathNode], exclusive: bool) -> None:
    """PostgreSQL: the memberships of `joining` inserted (those not there yet), with a delta row of the
    tool results among those it made; holding the conversation's row `exclusive`ly, the delta rows folded
    into its figure (counted with the join when it has none). Statements whose results nobody reads: a
    batch sends them with the capture's other writes."""
    if joining:
        connection.execute(_JOIN_RECORDING_ADDED, {
            "conversation": conversation, "nodes": [n.id for n in joining],
            "artifacts": [n.id for n in joining if is_artifact(n)]})
    if exclusive:
        connection.execute(_FOLD, {"conversation": conversation})


def gather_deltas(connection: Connection, conversation: str) -> None:
    """PostgreSQL, under a share lock: the conversation's delta rows that no other capture is gathering
    gathered into one (the sum the next read gives is the same)."""
    connection.execute(_GATHER, {"conversation": conversation})
