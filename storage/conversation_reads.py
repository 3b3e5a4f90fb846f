"""What a capture reads about its conversation for the assembly, once it has written the path: the
artifacts' facts (storage/path_reads.py), how many artifacts the conversation holds off the path, its
subagents' results, and the run the request continues. On SQLite after the capture's commit, off the
write lock; on PostgreSQL in the capture's own transaction, the conversation's reads in one statement.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from sqlalchemy import Connection, String, bindparam, select, text
from sqlalchemy.dialects.postgresql import ARRAY

from policies.transcript import PathNode, artifact_id_for
from storage.artifact_members import GATHER_ROWS, POSTGRESQL_COUNTED, POSTGRESQL_DELTAS, gather_deltas
from storage.path_reads import POSTGRESQL_ARTIFACT_FACTS, POSTGRESQL_PREVIOUS_RUN, PREVIOUS_RUN_WINDOW, PathReads
from storage.store_base import Batch, Queued
from storage.record_types import IngestResult, RunStart
from storage.schema import ModelRun

SIBLING_COUNT_BOUND = 10_000

_RUNS = ModelRun.__table__
_CHILD, _PARENT = _RUNS.alias("child_run"), _RUNS.alias("parent_run")
_SUBAGENT_RUNS = (  # driven by the children's `parent_conversation_id`; the parent must still be there
    select(_CHILD.c.id).join(_PARENT, _CHILD.c.parent_request_id == _PARENT.c.id)
    .where(_CHILD.c.parent_conversation_id == bindparam("conversation"), _CHILD.c.tenant == bindparam("tenant"),
           _PARENT.c.conversation_id == bindparam("conversation"), _PARENT.c.tenant == bindparam("tenant"))
)
_SUBAGENT_RUNS_BUT = _SUBAGENT_RUNS.where(_CHILD.c.parent_request_id != bindparam("own_parent"))
# PostgreSQL: the conversation's artifact memberships (its figure plus its delta rows, the join up to a
# bound without a figure: storage/artifact_members.py), the reads above and the previous run among the
# path's last leaves, in one round trip (each is a statement of its own on SQLite, where a statement
# costs no trip).
_PATH_STATE = text(
    f"SELECT {POSTGRESQL_COUNTED},"
    " ARRAY(SELECT child_run.id FROM model_runs AS child_run"
    "       JOIN model_runs AS parent_run ON child_run.parent_request_id = parent_run.id"
    "       WHERE child_run.parent_conversation_id = :conversation AND child_run.tenant = :tenant"
    "       AND parent_run.conversation_id = :conversation AND parent_run.tenant = :tenant"
    "       AND (CAST(:own_parent AS VARCHAR) IS NULL OR child_run.parent_request_id <> :own_parent)),"
    " previous.tokens_original, previous.leaf_node_id, previous.id, previous.conversation_id"
    f" FROM {POSTGRESQL_DELTAS} LEFT JOIN LATERAL ({POSTGRESQL_PREVIOUS_RUN}) AS previous ON true"
).bindparams(bindparam("leaves", type_=ARRAY(String)))


class Prefetched(NamedTuple):
    """PostgreSQL: the reads after a capture, queued at the end of its batch of writes (`queue_reads`),
    so they come back in the batch's round trip: the facts of the path's artifacts no earlier request
    read (None: none was missing), and `_PATH_STATE`'s row; and the path's artifact ids."""

    facts: Queued | None
    state: Queued
    artifact_ids: list[str]


class Written(NamedTuple):
    """What a capture's transaction found and wrote."""

    tree_id: str
    conversation: str
    new_node_ids: tuple[str, ...]
    new_artifact_ids: tuple[str, ...]
    incarnation: int  # the conversation's, read under its row's lock (storage/schema.py Conversation)
    artifact_members: int | None  # SQLite: its tool results once the capture's are in; PostgreSQL: None
    prefetched: Prefetched | None = None  # PostgreSQL


class ConversationReads(PathReads):
    """The reads after a capture (`_read_after_capture`), on the capture's connection."""

    def queue_reads(self, batch: Batch, path: Sequence[PathNode], run: RunStart, conversation: str,
                    incarnation: int) -> Prefetched:
        """PostgreSQL: the reads of `_read_after_capture` queued in the capture's batch, after its writes."""
        artifact_ids = _path_artifacts(path)
        missing = self._facts_missing(run.tenant, conversation, incarnation, artifact_ids)
        facts = batch.read(POSTGRESQL_ARTIFACT_FACTS, {"ids": missing}) if missing else None
        return Prefetched(facts, batch.read(_PATH_STATE, self._path_state_parameters(run, conversation, path)),
                          artifact_ids)

    def _read_after_capture(self, connection: Connection, path: Sequence[PathNode], run: RunStart,
                            written: Written) -> IngestResult:
        conversation = written.conversation
        prefetched = written.prefetched
        path_artifacts = prefetched.artifact_ids if prefetched is not None else _path_artifacts(path)
        observed, owners, rehydrated = self._path_facts(connection, run.tenant, conversation, written.incarnation,
                                                        path_artifacts, prefetched.facts if prefetched else None)
        # This run is pending (no tokens yet), so never its own previous one. Node ids hash the tenant
        # in, so the leaf index alone is tenant-scoped. The leaf itself counts: a request sent again (a
        # retry) continues the one it repeats.
        leaves = [n.id for n in path]
        if self.is_postgresql:
            in_conversation, subagent_results, previous = self._path_state(
                connection, run, conversation, path, prefetched.state.rows[0] if prefetched else None)
        else:  # counted by the capture (storage/artifact_members.py), bounded as the count is here
            in_conversation = min(written.artifact_members or 0, SIBLING_COUNT_BOUND + len(path))
            subagent_results = self._subagent_results(connection, run.tenant, conversation, run.parent_request_id)
            previous = self._previous_run(connection, leaves)
        return IngestResult(
            tree_id=written.tree_id,
            conversation_id=conversation,
            new_node_ids=written.new_node_ids,
            new_artifact_ids=written.new_artifact_ids,
            path_artifact_ids=tuple(path_artifacts),
            observed_at=observed,
            owners=owners,
            rehydrated=rehydrated,
            sibling_artifacts=max(0, int(in_conversation or 0) - len(path_artifacts)),
            subagent_results=subagent_results,
            previous_original_tokens=int(previous[0] or 0) if previous else 0,
            previous_leaf_position=next((n.position for n in path if previous and n.id == previous[1]), None),
            # a base for the assembly's stored decisions only within one conversation (deleted together)
            previous_request_id=previous[2] if previous and previous[3] == conversation else None,
        )

    @staticmethod
    def _path_state_parameters(run: RunStart, conversation: str, path: Sequence[PathNode]) -> dict[str, Any]:
        return {"conversation": conversation, "tenant": run.tenant, "own_parent": run.parent_request_id,
                "bound": SIBLING_COUNT_BOUND + len(path), "leaves": [n.id for n in path[-PREVIOUS_RUN_WINDOW:]]}

    def _path_state(self, connection: Connection, run: RunStart, conversation: str, path: Sequence[PathNode],
                    row: Any = None) -> tuple[int, dict[str, str], Any]:
        """PostgreSQL: (the conversation's artifacts up to the bound, its subagents' results, the previous
        run) in one statement (`row`, when it was read already), as storage/artifact_members.py counts
        them and `_subagent_results` and `_previous_run` give them; a second trip only when a subagent
        ran or no run ended among the last leaves."""
        parameters = self._path_state_parameters(run, conversation, path)
        if row is None:
            row = connection.execute(_PATH_STATE, parameters).one()
        in_conversation, deltas, children = min(int(row[0] or 0), parameters["bound"]), row[1], list(row[2] or [])
        previous = row[3:] if row[5] is not None else None
        if deltas > GATHER_ROWS:
            gather_deltas(connection, conversation)
        if previous is None and len(path) > PREVIOUS_RUN_WINDOW:
            previous = self._previous_run(connection, [n.id for n in path])
        return in_conversation, self._results_of_runs(connection, run.tenant, children) if children else {}, previous

    def _subagent_results(
        self, connection: Connection, tenant: str, conversation: str, own_parent: str | None
    ) -> dict[str, str]:
        """Results captured by subagent runs (of this tenant) whose parent run is in this conversation.

        Driven from the subagent runs whose parent is in the conversation (`parent_conversation_id`,
        indexed), so the cost follows how many there are, not the conversation's or the tenant's runs.
        """
        if own_parent is None:
            rows = self._execute(connection, _SUBAGENT_RUNS, {"conversation": conversation, "tenant": tenant})
        else:  # a subagent's own results are not private from itself
            rows = self._execute(connection, _SUBAGENT_RUNS_BUT, {"conversation": conversation, "tenant": tenant,
                                                                  "own_parent": own_parent})
        child_ids = [row[0] for row in rows]
        if not child_ids:
            return {}
        return self._results_of_runs(connection, tenant, child_ids)


def _path_artifacts(path: Sequence[PathNode]) -> list[str]:
    return [artifact_id_for(n.id) for n in path if n.message.get("role") == "tool"]
