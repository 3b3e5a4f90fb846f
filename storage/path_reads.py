"""What a capture asks the database about a path, with statements that do not grow with it (issue 27).

Every statement here takes its list of ids (a path's nodes, its leaves, its artifacts, the runs of a
conversation's subagents) as one parameter: on SQLite a JSON array read by `json_each`, on PostgreSQL
an array compared with `= ANY`. An `IN` list of one parameter per id failed past PostgreSQL's 65,535
parameters a statement (about 65,000 messages in one request), was rendered anew by SQLAlchemy for
every length, and was logged whole when it failed. Each statement here is built once, whatever the
path's length.
"""
from __future__ import annotations

import itertools
from datetime import datetime, timezone
from functools import cached_property
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import orjson
from sqlalchemy import Connection, String, any_, bindparam, func, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY

from policies.bounded_cache import BoundedCache
from policies.memo import memo
from storage.record_types import as_utc
from storage.schema import Conversation, ConversationNode, MessageNode, ModelRun, ToolArtifact
from storage.store_base import StoreBase

_PROBED_TAIL = 32  # the last nodes of a path whose state `_known_nodes` looks up every time

_RUNS, _NODES, _MEMBERS = ModelRun.__table__, MessageNode.__table__, ConversationNode.__table__
_CONVERSATIONS = Conversation.__table__
_ARTIFACTS = ToolArtifact.__table__


# The conversations that hold an artifact not yet marked rehydrated: their incarnations move on.
_NEXT_INCARNATION = (
    update(_CONVERSATIONS)
    .where(_CONVERSATIONS.c.tenant == bindparam("of_tenant"), _CONVERSATIONS.c.id.in_(
        select(_MEMBERS.c.conversation_id)
        .select_from(_MEMBERS.join(_ARTIFACTS, _ARTIFACTS.c.node_id == _MEMBERS.c.node_id))
        .where(_ARTIFACTS.c.id == bindparam("artifact"), _ARTIFACTS.c.tenant == bindparam("of_tenant"),
               _ARTIFACTS.c.rehydrated_at.is_(None))))
    .values(incarnation=_CONVERSATIONS.c.incarnation + 1)
)


def _facts_of(held: PathFacts, artifact_ids: list[str]) -> tuple[dict[str, float], dict[str, str], frozenset[str]]:
    """The held facts of `artifact_ids` (those the database has), as `_artifact_facts` gives them. Held
    for exactly these (a conversation without branches): copies, without a look-up per artifact."""
    if len(held.observed) == len(artifact_ids) == len(held.owners) and held.observed.keys() == set(artifact_ids) \
            and held.owners.keys() == held.observed.keys():
        return dict(held.observed), dict(held.owners), held.rehydrated.intersection(held.observed)
    observed = {a: held.observed[a] for a in artifact_ids if a in held.observed}
    return observed, {a: held.owners[a] for a in observed}, held.rehydrated.intersection(observed)


def _any(name: str) -> Any:
    """`= ANY` of the array parameter `name` (PostgreSQL)."""
    return any_(bindparam(name, type_=ARRAY(String)))


# The artifact facts a process keeps, in all (one per artifact of a path, its conversation's; about
# 200 bytes each): a few hundred long conversations.
FACTS_HELD = 100_000
FACTS_CONVERSATIONS = 4096

PREVIOUS_RUN_WINDOW = 64  # the leaves of a path where its previous run is looked for first (`_previous_run`)


# PostgreSQL: the latest finished run that ended on one of :leaves. Each leaf's latest is one probe from
# the end of ix_model_runs_leaf_started, however many runs ended there (a prefix sent again and again);
# the latest of those few is the answer. Also a part of storage/conversation_reads.py's `_PATH_STATE`.
POSTGRESQL_PREVIOUS_RUN = (
    "SELECT latest.tokens_original, latest.leaf_node_id, latest.id, latest.conversation_id"
    " FROM unnest(:leaves) AS leaf(id) CROSS JOIN LATERAL (SELECT tokens_original, leaf_node_id, id,"
    "   conversation_id, started_at FROM model_runs WHERE leaf_node_id = leaf.id AND tokens_original IS NOT NULL"
    "   ORDER BY started_at DESC LIMIT 1) AS latest ORDER BY latest.started_at DESC LIMIT 1")


class _Statements(NamedTuple):
    known_nodes: Any  # (conversation, ids) -> (node id, the node's id again if the conversation uses it)
    artifact_facts: Any  # (ids) -> (id, observed_at, owner_participant, whether a model had it back whole)
    previous_run: Any  # (leaves) -> the latest run that ended on one of them with tokens recorded
    runs_ending_at: Any  # (tenant, leaves) -> (leaf, its latest run's id or NULL), a row per leaf
    results_of_runs: Any  # (tenant, runs) -> (the sha256 of a result as sent, its tool's name)


_POSTGRESQL = _Statements(
    # Driven by the ids (an index probe of the conversation's memberships per node): an outer join let
    # the planner hash every membership of the conversation, a cost that grew with the conversation.
    known_nodes=select(_NODES.c.id, select(_MEMBERS.c.node_id)
                       .where(_MEMBERS.c.conversation_id == bindparam("conversation"),
                              _MEMBERS.c.node_id == _NODES.c.id).scalar_subquery())
    .where(_NODES.c.id == _any("ids")),
    artifact_facts=select(_ARTIFACTS.c.id, _ARTIFACTS.c.observed_at, _ARTIFACTS.c.owner_participant,
                          _ARTIFACTS.c.rehydrated_at.is_not(None))
    .where(_ARTIFACTS.c.id == _any("ids")),
    previous_run=text(POSTGRESQL_PREVIOUS_RUN).bindparams(bindparam("leaves", type_=ARRAY(String))),
    runs_ending_at=text(
        "SELECT leaf.id, (SELECT id FROM model_runs WHERE leaf_node_id = leaf.id AND tenant = :tenant"
        "   ORDER BY started_at DESC LIMIT 1) FROM unnest(:leaves) AS leaf(id)"
    ).bindparams(bindparam("leaves", type_=ARRAY(String))),
    results_of_runs=select(func.coalesce(_ARTIFACTS.c.original_sha256, _ARTIFACTS.c.sha256), _ARTIFACTS.c.tool_name)
    .where(_ARTIFACTS.c.captured_by_request == _any("runs"), _ARTIFACTS.c.tenant == bindparam("tenant")),
)
# On SQLite as text: the artifact facts are read through the driver itself (see `_artifact_facts`).
_SQLITE = _Statements(
    known_nodes=text(
        "SELECT message_nodes.id, conversation_nodes.node_id FROM message_nodes LEFT OUTER JOIN conversation_nodes"
        " ON conversation_nodes.node_id = message_nodes.id AND conversation_nodes.conversation_id = :conversation"
        " WHERE message_nodes.id IN (SELECT value FROM json_each(:ids))"),
    artifact_facts=text(
        "SELECT id, observed_at, owner_participant, rehydrated_at IS NOT NULL FROM tool_artifacts"
        " WHERE id IN (SELECT value FROM json_each(:ids))"),
    previous_run=text(
        "SELECT latest.tokens_original, latest.leaf_node_id, latest.id, latest.conversation_id"
        " FROM json_each(:leaves) AS leaf JOIN model_runs AS latest ON latest.id = (SELECT id FROM model_runs"
        "   WHERE leaf_node_id = leaf.value AND tokens_original IS NOT NULL ORDER BY started_at DESC LIMIT 1)"
        " ORDER BY latest.started_at DESC LIMIT 1"),
    runs_ending_at=text(
        "SELECT leaf.value, (SELECT id FROM model_runs WHERE leaf_node_id = leaf.value AND tenant = :tenant"
        "   ORDER BY started_at DESC LIMIT 1) FROM json_each(:leaves) AS leaf"),
    results_of_runs=text(
        "SELECT coalesce(original_sha256, sha256), tool_name FROM tool_artifacts"
        " WHERE captured_by_request IN (SELECT value FROM json_each(:runs)) AND tenant = :tenant"),
)


def _states(rows: Iterable[Any]) -> tuple[set[str], set[str]]:
    """(the nodes that exist, those the conversation uses) from `known_nodes`'s rows."""
    existing: set[str] = set()
    members: set[str] = set()
    for node, member in rows:
        existing.add(node)
        if member is not None:
            members.add(node)
    return existing, members


POSTGRESQL_ARTIFACT_FACTS = _POSTGRESQL.artifact_facts


def _postgresql_facts(rows: Iterable[Any]) -> tuple[dict[str, float], dict[str, str], frozenset[str]]:
    """`_artifact_facts` from the rows of PostgreSQL's statement."""
    observed: dict[str, float] = {}
    owners: dict[str, str] = {}
    rehydrated: set[str] = set()
    for artifact_id, moment, owner, back in rows:
        observed[artifact_id] = as_utc(moment).timestamp()
        owners[artifact_id] = owner
        if back:
            rehydrated.add(artifact_id)
    return observed, owners, frozenset(rehydrated)


def statements(connection: Connection) -> _Statements:
    return _SQLITE if connection.dialect.name == "sqlite" else _POSTGRESQL


def id_list(connection: Connection, ids: Sequence[str]) -> Any:
    """`ids` as the one parameter of these statements: a JSON array on SQLite (written by orjson: a
    1,000-id list by json.dumps took about 0.37 ms of CPU), a list (an array) on PostgreSQL."""
    return orjson.dumps(list(ids)).decode() if connection.dialect.name == "sqlite" else list(ids)


_NAIVE_EPOCH = datetime(1970, 1, 1)


def _sqlite_moment(value: str | datetime) -> float:
    """Unix seconds of a DateTime as SQLite holds it (SQLAlchemy's text of a naive UTC datetime).

    Exactly `as_utc(moment).timestamp()` (both divide whole microseconds by a million), without making
    an aware datetime for every artifact of the path."""
    if isinstance(value, str):
        return _sqlite_text_moment(value)
    if value.tzinfo is None:
        return (value - _NAIVE_EPOCH).total_seconds()
    return value.timestamp()


@memo(maxsize=65536)
def _sqlite_text_moment(value: str) -> float:
    """`_sqlite_moment` of SQLite's text, remembered: a path's artifacts are read again on every request
    of their conversation, each with the same text."""
    return _sqlite_moment(datetime.fromisoformat(value))


class PathFacts(NamedTuple):
    """What a process holds of one conversation's artifacts, valid for one incarnation of it: when each
    was observed, who owns it, those a model had back whole."""

    observed: Mapping[str, float]
    owners: Mapping[str, str]
    rehydrated: frozenset[str]


class PathReads(StoreBase):
    """The reads of a capture that take a path's ids, on the capture's connection."""

    @cached_property
    def _facts_held(self) -> BoundedCache:
        """(tenant, conversation, incarnation) -> PathFacts: the facts read by earlier requests."""
        return BoundedCache(FACTS_CONVERSATIONS, max_weight=FACTS_HELD, weigh=lambda facts: len(facts.observed) + 1)

    def _facts_missing(self, tenant: str, conversation: str, incarnation: int, artifact_ids: list[str]) -> list[str]:
        """Those of `artifact_ids` whose facts `_path_facts` would read."""
        held: PathFacts | None = self._facts_held.get((tenant, conversation, incarnation))
        if held is None:
            return list(artifact_ids)
        return list(itertools.filterfalse(held.observed.__contains__, artifact_ids))

    def _path_facts(self, connection: Connection, tenant: str, conversation: str, incarnation: int,
                    artifact_ids: list[str], read: Any = None,
                    ) -> tuple[dict[str, float], dict[str, str], frozenset[str]]:
        """`_artifact_facts` of the path's artifacts, reading only those no earlier request of this
        incarnation of the conversation read: an agent's request adds a round or two to the path the
        one before it had, so a 1,000-message request reads a few rows, not 500.

        What is held stays true while the incarnation does. An artifact's observation and owner are
        written once, with its row. A row goes only when retention claims the conversation, or
        deletion removes it (it comes back with a new random incarnation), and a rehydration mark
        moves the incarnation on (`mark_rehydrated`): the capture read the incarnation under the
        conversation's row lock, so what a later write changed is read again, on every replica. `read`:
        the capture's batch's read of the facts of those it found missing (`_facts_missing`), if any."""
        key = (tenant, conversation, incarnation)
        held: PathFacts | None = self._facts_held.get(key)
        if read is not None:  # read in the capture's batch: the facts of those it found missing then
            observed, owners, rehydrated = _postgresql_facts(read.rows)
        else:
            missing = self._facts_missing(tenant, conversation, incarnation, artifact_ids)
            if held is not None and not missing:
                return _facts_of(held, artifact_ids)
            observed, owners, rehydrated = self._artifact_facts(connection, missing)
        if held is not None:
            observed = {**held.observed, **observed}
            owners = {**held.owners, **owners}
            rehydrated = held.rehydrated | rehydrated
        merged = PathFacts(observed, owners, rehydrated)
        self._facts_held.put(key, merged)
        return _facts_of(merged, artifact_ids)

    @staticmethod
    def _probed(ids: list[str]) -> list[int]:
        """The positions of the path `ids` whose state `_known_nodes` always looks up."""
        count = len(ids)
        probes = set(range(max(0, count - _PROBED_TAIL), count))
        back = _PROBED_TAIL
        while back < count:
            probes.add(count - 1 - back)
            back *= 2
        return sorted(probes)

    def _known_nodes(self, connection: Connection, conversation: str, ids: list[str],
                     probed: Iterable[Any] | None = None) -> tuple[set[str], set[str]]:
        """(the nodes of the path `ids` that exist, those of them this conversation already uses), asking
        the database about what is new rather than about every node.

        A conversation's nodes are prefix-closed: a path's nodes join it together, in the transaction
        that captures the path, and leave it together (a deletion removes a conversation's memberships
        whole); a node's id names its parent, so a node of the conversation brings every node before it
        on the path. So the last `_PROBED_TAIL` nodes and a few further back (exponentially spaced) are
        looked up; every node up to the deepest one the conversation uses is known without a look, and
        only the unlooked nodes past it are looked up, a run proportional to what the request adds.
        `probed`: the rows `known_nodes` gave for the nodes at `_probed(ids)`, when they were read already.
        """
        count = len(ids)
        probes = self._probed(ids)
        if probed is None:
            existing, members = self._node_states(connection, conversation, [ids[i] for i in probes])
        else:
            existing, members = _states(probed)
        deepest = max((i for i in probes if ids[i] in members), default=-1)
        looked = set(probes)
        unlooked = [ids[i] for i in range(deepest + 1, count) if i not in looked]
        if unlooked:
            more_existing, more_members = self._node_states(connection, conversation, unlooked)
            existing |= more_existing
            members |= more_members
        known = ids[:deepest + 1]
        return existing.union(known), members.union(known)

    def _node_states(self, connection: Connection, conversation: str,
                     ids: list[str]) -> tuple[set[str], set[str]]:
        """(the nodes of `ids` that exist, those of them this conversation already uses), looked up."""
        return _states(self._execute(connection, statements(connection).known_nodes,
                                     {"conversation": conversation, "ids": id_list(connection, ids)}))

    def _artifact_facts(
        self, connection: Connection, artifact_ids: list[str]
    ) -> tuple[dict[str, float], dict[str, str], frozenset[str]]:
        """(when each artifact of `artifact_ids` was observed, in Unix seconds; who owns it; those a model
        had back whole through the rehydration tool)."""
        observed: dict[str, float] = {}
        owners: dict[str, str] = {}
        rehydrated: set[str] = set()
        if connection.dialect.name == "sqlite":
            # Text, so the driver's own values (storage/driver_statements.py: no result processor): through
            # SQLAlchemy's result, each of a 1,000-message path's ~500 rows cost more than SQLite took to
            # find it, and its DateTime read a regex per row.
            for artifact_id, moment, owner, back in self._execute(
                    connection, _SQLITE.artifact_facts, {"ids": id_list(connection, artifact_ids)}):
                observed[artifact_id] = _sqlite_moment(moment)
                owners[artifact_id] = owner
                if back:
                    rehydrated.add(artifact_id)
            return observed, owners, frozenset(rehydrated)
        return _postgresql_facts(connection.execute(_POSTGRESQL.artifact_facts, {"ids": artifact_ids}))

    def mark_rehydrated(self, tenant: str, artifact_id: str) -> None:
        """Note that a model had `artifact_id` back whole (the first time only): the conversation's later
        requests forward it whole (policies/assembler.py `_rehydrate_named`). The incarnation of every
        conversation that holds it moves on first, so no process reads it from what it held before."""
        with self._writing, self.engine.begin() as connection:
            connection.execute(_NEXT_INCARNATION, {"of_tenant": tenant, "artifact": artifact_id})
            connection.execute(_ARTIFACTS.update().where(
                _ARTIFACTS.c.id == artifact_id, _ARTIFACTS.c.tenant == tenant, _ARTIFACTS.c.rehydrated_at.is_(None),
            ).values(rehydrated_at=datetime.fromtimestamp(self.clock(), timezone.utc)))

    def _previous_run(self, connection: Connection, leaves: list[str]) -> Any:
        """(tokens_original, leaf, id, conversation) of the latest run that ended on one of `leaves`
        with its tokens recorded (a finished run), or None. Looked for among the last
        `PREVIOUS_RUN_WINDOW` leaves first, where an agent's previous request ended (an agent adds a
        round or two per request), so the lookup does not grow with the conversation; among them all
        only when none ended there (a conversation's first request here, a resend of an old prefix)."""
        statement = statements(connection).previous_run
        recent = leaves[-PREVIOUS_RUN_WINDOW:]
        found = self._execute(connection, statement, {"leaves": id_list(connection, recent)})
        if not found and len(recent) < len(leaves):
            found = self._execute(connection, statement, {"leaves": id_list(connection, leaves)})
        return found[0] if found else None

    def _runs_ending_at(self, connection: Connection, tenant: str, leaves: Iterable[str]) -> Mapping[str, str]:
        """The latest run of `tenant` whose request ended at each of `leaves` (those that have one)."""
        wanted = list(dict.fromkeys(leaves))
        if not wanted:
            return {}
        rows = self._execute(connection, statements(connection).runs_ending_at,
                             {"tenant": tenant, "leaves": id_list(connection, wanted)})
        return {leaf: run for leaf, run in rows if run is not None}

    def _results_of_runs(self, connection: Connection, tenant: str, runs: list[str]) -> dict[str, str]:
        """The tool results `runs` captured, by the sha256 of the content as sent: their tools' names."""
        rows = self._execute(connection, statements(connection).results_of_runs,
                             {"tenant": tenant, "runs": id_list(connection, runs)})
        return {sha: name or "" for sha, name in rows}
