"""Capture: the durable step of the request path (a run's outcome: storage/run_outcomes.py).

`ingest` commits every new message node, tool call and tool artifact of a
request (large artifacts written to the blob store and fsynced first), the
request's membership in its conversation, and the pending ModelRun, in one
transaction, before anything is forwarded. Re-sent transcripts map onto
existing nodes, so nothing is stored twice; concurrent replicas inserting the
same rows do not conflict. A conversation deleted while a request that shares
its nodes is being captured makes that capture fail a foreign key and start
over, so no request ever ends up pointing at removed rows.
"""
from __future__ import annotations

import functools
import itertools
import operator
from datetime import datetime, timedelta
from typing import Any, Collection, Literal, Sequence, overload

from sqlalchemy import Connection, bindparam, insert, select
from sqlalchemy.exc import DataError, IntegrityError

from policies.transcript import PathNode, label_conversation_id, tool_call_pk
from storage.artifact_members import artifact_members, inserted_artifacts, join_counting
from storage.capture_rows import CaptureRows, Prepared
from storage.encryption import call_arguments_aad
from storage.conversation_reads import ConversationReads, Written
from storage.path_reads import id_list, statements
from storage.record_types import (
    CapturedThenFailed,
    IngestResult,
    RunStart,
    UnknownParentRequest,
    UnstorableValue,
)
from storage.run_outcomes import RunOutcomes
from storage.schema import (
    Blob,
    Conversation,
    ConversationNode,
    MessageNode,
    ModelRun,
    ToolArtifact,
    ToolCall,
)

INGEST_ATTEMPTS = 3

# The request path's statements, built once against the tables (Core on a plain connection: building
# a statement and the ORM's compile and unit of work cost more per request than running them). Those
# that take a path's ids are in storage/path_reads.py.
_RUNS, _MEMBERS = ModelRun.__table__, ConversationNode.__table__
_ARTIFACTS = ToolArtifact.__table__
_PARENT_RUN = select(_RUNS.c.tenant, _RUNS.c.conversation_id).where(_RUNS.c.id == bindparam("id"))
_CONVERSATIONS = Conversation.__table__
# PostgreSQL: a conversation whose last activity is this recent is share-locked by a capture, not touched
# (see `Capture._hold_conversation`).
ACTIVE_WINDOW = timedelta(seconds=1)
_SHARE_ACTIVE_CONVERSATION = (
    select(_CONVERSATIONS.c.incarnation)
    .where(_CONVERSATIONS.c.id == bindparam("id"), _CONVERSATIONS.c.collected == 0,
           _CONVERSATIONS.c.last_active_at >= bindparam("since"),
           _CONVERSATIONS.c.artifact_members.is_not(None))  # else counted first, exclusively
    .with_for_update(read=True)  # FOR SHARE
)
_INSERT_RUN = insert(_RUNS)
_INCARNATION = (select(_CONVERSATIONS.c.incarnation, _CONVERSATIONS.c.artifact_members)
                .where(_CONVERSATIONS.c.id == bindparam("id")))


class Capture(CaptureRows, ConversationReads, RunOutcomes):
    def ingest(self, path: Sequence[PathNode], run: RunStart) -> IngestResult:
        """Store the request's new nodes, tool calls and artifacts, and open its run."""
        if not path:
            raise ValueError("a request has at least one message")
        if self.is_postgresql:
            # In the capture's own transaction: the reads see its writes, and the request spends no
            # second connection (a pool checkout, its ping, BEGIN and ROLLBACK: four round trips more).
            return self._write_capture(path, run, read=True)
        written = self._write_capture(path, run)
        # On SQLite what the assembly reads about the path is read after the commit, off the write lock
        # (one writer: what is done under it is what bounds throughput); it sees this capture and any
        # committed since, as if the request had come a moment later.
        try:
            with self.engine.connect() as connection:
                return self._read_after_capture(connection, path, run, written)
        except Exception as exc:  # the run is stored: the caller must know it has an outcome to record
            raise _captured_then_failed(exc) from exc

    @overload
    def _write_capture(self, path: Sequence[PathNode], run: RunStart) -> Written: ...

    @overload
    def _write_capture(self, path: Sequence[PathNode], run: RunStart, read: Literal[True]) -> IngestResult: ...

    def _write_capture(self, path: Sequence[PathNode], run: RunStart, read: bool = False) -> Written | IngestResult:
        """The capture, committed; with `read`, and what the assembly reads about the path, in the same
        transaction."""
        prepared = self._prepare(path, run)

        def capture(connection: Connection) -> Written | IngestResult:
            written = self._ingest(connection, path, run, prepared)
            if not read:
                return written
            try:
                return self._read_after_capture(connection, path, run, written)
            except Exception as exc:
                if self._committed(connection):  # its COMMIT went with its last batch: the run is stored
                    raise _captured_then_failed(exc) from exc
                raise

        for attempt in range(1, INGEST_ATTEMPTS + 1):
            try:
                captured = self._in_transaction(capture, folded=True)
            except DataError as exc:
                raise UnstorableValue(str(getattr(exc, "orig", exc)).splitlines()[0]) from exc
            except IntegrityError:
                # A node this path shares went with a conversation deleted meanwhile:
                # capture again, and the missing nodes are stored anew.
                if attempt == INGEST_ATTEMPTS:
                    raise
            else:
                self._captured_leaves.put(path[-1].id, True)
                return captured
        raise AssertionError("unreachable")

    def _ingest(self, connection: Connection, path: Sequence[PathNode], run: RunStart, prepared: Prepared) -> Written:
        tenant, tree_id, conversation, now = run.tenant, prepared.tree_id, prepared.conversation, prepared.now
        # First: the row lock it takes is what garbage collection rechecks a conversation under.
        ids = [n.id for n in path]
        incarnation, stored_members, exclusive, probed = self._hold_conversation(
            connection, tenant, conversation, now, prepared.opening_node, ids)
        parent = self._parent_run(connection, run)
        if run.parent_request_id is not None and parent is None:  # unknown, or another tenant's: one answer
            raise UnknownParentRequest(run.parent_request_id)
        existing, members = self._known_nodes(connection, conversation, ids, probed)
        built = prepared.rows
        if set(ids).difference(existing, built):  # new, yet not among the likely new
            built = {**built, **self._new_rows(tenant, tree_id, path, lambda i: i not in existing and i not in built,
                                               run, now)}
        new = _not_in(path, ids, existing)
        node_rows, asking, artifact_rows, blobs = [], [], [], {}
        for node in new:
            row, artifact, raw = built[node.id]
            node_rows.append(row)
            if artifact is not None:
                artifact_rows.append(artifact)
                if artifact["blob_key"]:
                    blobs[artifact["blob_key"]] = raw
            if node.message.get("role") == "assistant" and node.message.get("tool_calls"):
                asking.append(node)
        call_rows = self._call_rows(connection, tenant, asking, now)  # its read first: the writes go as one batch
        joining = _not_in(path, ids, members)
        # Not in the batch: a file is written only once its registry row's lock is held, not merely asked for.
        self._write_blobs(connection, blobs, now)
        with self._batched(connection, last=True) as batch:  # PostgreSQL: one round trip for them all, COMMIT too
            self._insert_ignoring_conflicts(connection, MessageNode, node_rows)
            self._insert_ignoring_conflicts(connection, ToolCall, call_rows)
            self._insert_ignoring_conflicts(connection, ToolArtifact, artifact_rows)
            in_conversation = self._join_conversation(connection, conversation, path, joining, stored_members,
                                                      exclusive)
            self._execute(connection, _INSERT_RUN, [self._run_row(run, tree_id, conversation, path, parent)])
            # and, in the same trip, what the assembly reads after them
            prefetched = self.queue_reads(batch, path, run, conversation, incarnation) if self.is_postgresql else None
        return Written(tree_id, conversation, tuple(n.id for n in new), tuple(a["id"] for a in artifact_rows),
                       incarnation, in_conversation, prefetched)

    def _join_conversation(self, connection: Connection, conversation: str, path: Sequence[PathNode],
                           joining: list[PathNode], stored: int | None, exclusive: bool) -> int | None:
        """Make the nodes of `joining` members of the conversation, and keep the count of its tool results
        (storage/artifact_members.py): on SQLite its figure once they are in, from `stored`; on PostgreSQL
        None (read with the reads after the capture), `exclusive`: whether the capture holds its row so."""
        if self.is_postgresql:
            join_counting(connection, conversation, joining, exclusive)
            return None
        joined = self._insert_ignoring_conflicts(
            connection, ConversationNode, [{"conversation_id": conversation, "node_id": n.id} for n in joining],
            returning="node_id")
        return artifact_members(functools.partial(self._execute, connection), conversation, stored,
                                inserted_artifacts(path, joined))

    def _parent_run(self, connection: Connection, run: RunStart) -> Any:
        """The row (tenant, conversation) of the run `run` names as its parent, when one of its tenant
        is there; else None."""
        if run.parent_request_id is None:
            return None
        found = self._execute(connection, _PARENT_RUN, {"id": run.parent_request_id})
        return found[0] if found and found[0][0] == run.tenant else None

    def _run_row(self, run: RunStart, tree_id: str, conversation: str,
                 path: Sequence[PathNode], parent: Any = None) -> dict[str, Any]:
        return dict(
            id=run.request_id,
            tenant=run.tenant,
            session_id=tree_id,  # the column of the tree
            session_label=run.session_label,
            conversation_id=conversation,
            participant=run.participant,
            parent_request_id=run.parent_request_id,
            parent_conversation_id=parent[1] if parent is not None else None,
            model=run.model,
            upstream_model=run.upstream_model,
            leaf_node_id=path[-1].id if path else run.request_id,
            message_count=len(path),
            stream=run.stream,
            wire_format=run.wire_format,
            api_key_id=run.api_key_id,
            instance_id=self.instance_id,
            status="pending",
            key_id=self.encryption.current_id,
            started_at=run.started_at,
            evaluation_arm=run.evaluation_arm,
            policy_version=run.policy_version,
        )

    def _write_blobs(self, connection: Connection, blobs: dict[str, bytes], now: datetime) -> None:
        """Write large artifacts' files, each under its registry row's lock (see storage/deletion.py).

        The upsert locks the row until this transaction ends, so blob collection, which
        deletes the row before it removes a file, cannot remove one this capture relies on.
        """
        for key in sorted(blobs):  # one order everywhere: no deadlock between captures
            statement = self._insert(Blob).values(key=key, size_bytes=len(blobs[key]), created_at=now,
                                                  key_id=self.encryption.current_id)
            connection.execute(statement.on_conflict_do_update(index_elements=[Blob.key], set_={
                "size_bytes": statement.excluded.size_bytes, "key_id": statement.excluded.key_id}))
            # Verifies what is there (re-sealing a file under an older key, or in the clear, with the
            # current one); fsynced before the row commits.
            self.sealed_blobs.put(blobs[key])

    def _call_rows(self, connection: Connection, tenant: str, asking: list[PathNode],
                   now: datetime) -> list[dict[str, Any]]:
        """The rows of the tool calls of the new assistant messages `asking`, each call with the run
        whose request ended at its message's parent (the run that produced it), looked up in one go."""
        producers = self._runs_ending_at(connection, tenant, [n.parent_id for n in asking if n.parent_id])
        rows = []
        for node in asking:
            run_id = producers.get(node.parent_id) if node.parent_id is not None else None
            for call in node.message.get("tool_calls") or []:
                function = call.get("function") or {}
                call_id = str(call.get("id") or "")
                pk = tool_call_pk(node.id, call_id)
                rows.append({
                    "id": pk,
                    "tenant": tenant,
                    "node_id": node.id,
                    "call_id": call_id,
                    "name": str(function.get("name") or ""),
                    "arguments": self.encryption.seal_text(str(function.get("arguments") or ""),
                                                           call_arguments_aad(pk)),
                    "key_id": self.encryption.current_id,
                    "run_id": run_id,
                    "created_at": now,
                })
        return rows

    def open_run(self, run: RunStart) -> None:
        """A pending run without a transcript (embeddings, completions): it is its own conversation,
        unless a session label names one."""
        conversation = label_conversation_id(run.tenant, run.session_label) if run.session_label else run.request_id
        with self.engine.begin() as connection:
            self._touch_conversation(connection, run.tenant, conversation, self._now())
            parent = self._parent_run(connection, run)
            self._execute(connection, _INSERT_RUN, [self._run_row(run, run.request_id, conversation, (), parent)])

    def _hold_conversation(self, connection: Connection, tenant: str, conversation: str, now: datetime,
                           opening_node: str | None, ids: list[str]) -> tuple[int, int | None, bool, Any]:
        """Lock the conversation's row for this capture, which garbage collection and deletion take
        exclusively (so neither runs across a capture), and record the conversation's activity.

        On PostgreSQL a conversation active within `ACTIVE_WINDOW` is only share-locked: collection and
        deletion still wait for the capture to commit (and collection, rechecking idleness then, finds
        the conversation active), but captures of one conversation no longer wait for each other. Every
        capture took the row exclusively before, and under concurrent requests in one conversation 44%
        of the database sessions were found waiting for that lock. Otherwise (a conversation new,
        collected from, or idle for longer), and always on SQLite, which has one writer anyway, the
        touch takes the row exclusively and moves its last activity. Neither holds a share lock that it
        then asks to upgrade: the share lock is taken only where no touch follows.

        A conversation whose artifact memberships have no figure yet is taken exclusively too, so that
        the capture counts them (storage/artifact_members.py).

        The lock goes to the server with the first look at which of the path's nodes (`ids`) exist
        (`_known_nodes`), and the touch with the reads of the row and that look, each in one round trip
        on PostgreSQL (`_batched`): the server runs them in order, so the look runs under the lock, as it
        would alone. A look taken with a share lock that was not granted is not used.

        Returns the conversation's incarnation and its counted artifact memberships (None: not counted,
        or held only shared), read under the lock; whether the lock is exclusive; and the rows of the
        first look at the path's nodes."""
        look = (statements(connection).known_nodes,
                {"conversation": conversation, "ids": id_list(connection, [ids[i] for i in self._probed(ids)])})
        if self.is_postgresql:
            held, probed = self._read_together(connection, [
                (_SHARE_ACTIVE_CONVERSATION, {"id": conversation, "since": now - ACTIVE_WINDOW}), look])
            if held:
                return int(held[0][0]), None, False, probed
        with self._batched(connection) as batch:
            self._touch_conversation(connection, tenant, conversation, now, opening_node)
            row = batch.read(_INCARNATION, {"id": conversation})
            looked = batch.read(*look)
        incarnation, counted = row.rows[0]
        return int(incarnation), counted, True, looked.rows


def _captured_then_failed(exc: Exception) -> CapturedThenFailed:
    first_line = (str(exc).splitlines() or [""])[0][:300]
    return CapturedThenFailed(f"after the capture: {type(exc).__name__}: {first_line}")


def _not_in(path: Sequence[PathNode], ids: Sequence[str], found: Collection[str]) -> list[PathNode]:
    """The nodes of `path` (whose ids are `ids`) not in `found`, in order: `[n for n in path if n.id not in
    found]` without a Python step per node (a 1,000-message path, under the write lock on SQLite)."""
    return list(itertools.compress(path, map(operator.not_, map(found.__contains__, ids))))
