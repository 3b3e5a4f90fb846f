"""The record store: capture of transcripts, tool calls, artifacts and model runs.

`RecordStore.ingest` is the durable step of the request path: every new
message node, tool call and tool artifact of a request is committed (blobs
fsynced first) together with the pending ModelRun, before anything is
forwarded upstream. Re-sent transcripts map onto existing nodes, so nothing
is stored twice; concurrent replicas inserting the same rows do not conflict.
"""
from __future__ import annotations

import hashlib
import json
import time
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Engine, delete, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased

from policies.tokens import count_text
from policies.tool_status import tool_result_status
from policies.transcript import (
    PathNode,
    artifact_id_for,
    canonical_json,
    tool_call_pk,
    tool_result_bytes,
)
from storage.blobs import DirectoryBlobStore
from storage.record_types import (
    ArtifactCorrupted,
    ArtifactRecord,
    AssemblyRecord,
    IngestResult,
    RunOutcome,
    RunRecord,
    RunStart,
    artifact_from_row,
    assembly_from_row,
    assembly_to_row,
    as_utc,
    run_as_dict,
)
from storage.schema import Base, ContextAssembly, MessageNode, ModelRun, ToolArtifact, ToolCall

DEFAULT_INLINE_MAX_BYTES = 64 * 1024
SIBLING_COUNT_BOUND = 10_000
_MIGRATION_LOCK = 0x6761_7465  # "gate": the advisory lock id migrations hold on PostgreSQL


def conversation_of(path: Sequence[PathNode]) -> str:
    """The node that starts the conversation: the first message after system/developer prompts."""
    for node in path:
        if node.message.get("role") not in ("system", "developer"):
            return node.id
    return path[-1].id


class RecordStore:
    """Repositories over one SQLAlchemy engine and one blob store."""

    def __init__(
        self,
        engine: Engine,
        blobs: DirectoryBlobStore,
        *,
        inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.blobs = blobs
        self.inline_max_bytes = inline_max_bytes
        self._insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), timezone.utc)

    def create_schema(self) -> None:
        """Bring the database to the latest schema (Alembic migrations in storage/migrations).

        On PostgreSQL an advisory lock serialises replicas that start together.
        """
        config = AlembicConfig()
        config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
        with self.engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            config.attributes["connection"] = connection
            alembic_command.upgrade(config, "head")

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    # -- capture -------------------------------------------------------------

    def ingest(self, path: Sequence[PathNode], run: RunStart) -> IngestResult:
        """Store the request's new nodes, tool calls and artifacts, and open its run."""
        if not path:
            raise ValueError("a request has at least one message")
        tenant = run.tenant
        session_id = path[0].id
        now = self._now()
        with Session(self.engine) as session, session.begin():
            existing = self._existing_nodes(session, [n.id for n in path])
            new: list[PathNode] = []
            node_rows, call_rows, artifact_rows = [], [], []
            # call id -> (assistant node, call, author): a result belongs to whoever made the call
            open_calls: dict[str, tuple[str, Mapping[str, Any], str | None]] = {}
            for node in path:
                if node.message.get("role") == "assistant":
                    author = node.message.get("name")
                    open_calls = {
                        str(c.get("id")): (node.id, c, author) for c in node.message.get("tool_calls") or []
                    }
                if node.id in existing:
                    continue
                new.append(node)
                row, artifact = self._node_rows(tenant, session_id, node, open_calls, run, now)
                node_rows.append(row)
                if artifact is not None:
                    artifact_rows.append(artifact)
                call_rows.extend(self._call_rows(session, tenant, node, now))
            self._insert_ignoring_conflicts(session, MessageNode, node_rows)
            self._insert_ignoring_conflicts(session, ToolCall, call_rows)
            self._insert_ignoring_conflicts(session, ToolArtifact, artifact_rows)
            path_artifacts = [artifact_id_for(n.id) for n in path if n.message.get("role") == "tool"]
            observed, owners = self._artifact_facts(session, path_artifacts)
            # Sibling branches are counted up to a bound: a session is a whole tree (every
            # conversation that starts the same way), so an exact count would grow without end.
            in_session = session.scalar(
                select(func.count()).select_from(
                    select(ToolArtifact.session_id).where(ToolArtifact.session_id == session_id)  # index only
                    .limit(SIBLING_COUNT_BOUND + len(path)).subquery()
                )
            )
            subagent_results = self._subagent_results(session, tenant, session_id, run.parent_request_id)
            # Node ids hash the tenant in, so the leaf index alone is tenant-scoped.
            previous = session.scalar(
                select(ModelRun.tokens_original)
                .where(ModelRun.leaf_node_id.in_([n.id for n in path[:-1]]),
                       ModelRun.tokens_original.is_not(None))
                .order_by(ModelRun.started_at.desc())
                .limit(1)
            )
            session.add(
                ModelRun(
                    id=run.request_id,
                    tenant=tenant,
                    session_id=session_id,
                    session_label=run.session_label,
                    conversation_id=conversation_of(path),
                    participant=run.participant,
                    parent_request_id=run.parent_request_id,
                    model=run.model,
                    upstream_model=run.upstream_model,
                    leaf_node_id=path[-1].id,
                    message_count=len(path),
                    stream=run.stream,
                    status="pending",
                    started_at=run.started_at,
                )
            )
        return IngestResult(
            session_id=session_id,
            new_node_ids=tuple(n.id for n in new),
            new_artifact_ids=tuple(a["id"] for a in artifact_rows),
            path_artifact_ids=tuple(path_artifacts),
            observed_at=observed,
            owners=owners,
            sibling_artifacts=max(0, int(in_session or 0) - len(path_artifacts)),
            subagent_results=subagent_results,
            previous_original_tokens=int(previous or 0),
        )

    def _subagent_results(
        self, session: Session, tenant: str, session_id: str, own_parent: str | None
    ) -> dict[str, str]:
        """Results captured by subagent runs whose parent run belongs to this session.

        Driven from the session's runs through the parent_request_id index, so the
        cost follows the session's size, not the tenant's history.
        """
        child = aliased(ModelRun)
        parent = aliased(ModelRun)
        children = (
            select(child.id)
            .join(parent, child.parent_request_id == parent.id)
            .where(parent.session_id == session_id, parent.tenant == tenant)
        )
        if own_parent is not None:  # a subagent's own results are not private from itself
            children = children.where(child.parent_request_id != own_parent)
        child_ids = list(session.scalars(children))
        if not child_ids:
            return {}
        query = select(ToolArtifact.sha256, ToolArtifact.tool_name).where(
            ToolArtifact.captured_by_request.in_(child_ids)
        )
        return {sha: name or "" for sha, name in session.execute(query)}

    def _artifact_facts(
        self, session: Session, artifact_ids: list[str]
    ) -> tuple[dict[str, float], dict[str, str]]:
        observed: dict[str, float] = {}
        owners: dict[str, str] = {}
        for start in range(0, len(artifact_ids), 500):
            chunk = artifact_ids[start : start + 500]
            rows = session.execute(
                select(ToolArtifact.id, ToolArtifact.observed_at, ToolArtifact.owner_participant)
                .where(ToolArtifact.id.in_(chunk))
            )
            for artifact_id, moment, owner in rows:
                observed[artifact_id] = as_utc(moment).timestamp()
                owners[artifact_id] = owner
        return observed, owners

    def _existing_nodes(self, session: Session, ids: list[str]) -> set[str]:
        found: set[str] = set()
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            found.update(session.scalars(select(MessageNode.id).where(MessageNode.id.in_(chunk))))
        return found

    def _node_rows(
        self,
        tenant: str,
        session_id: str,
        node: PathNode,
        calls: Mapping[str, tuple[str, Mapping[str, Any], str | None]],
        run: RunStart,
        now: datetime,
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        message = dict(node.message)
        role = str(message.get("role"))
        artifact = None
        artifact_id = None
        if role == "tool":
            artifact_id = artifact_id_for(node.id)
            artifact = self._artifact_row(tenant, session_id, node, artifact_id, calls, run, now)
            message.pop("content", None)  # the artifact holds it, byte-exact
        row = {
            "id": node.id,
            "tenant": tenant,
            "parent_id": node.parent_id,
            "session_id": session_id,
            "depth": node.position,
            "role": role,
            "message_json": canonical_json(message),
            "artifact_id": artifact_id,
            "first_request_id": run.request_id,
            "created_at": now,
        }
        return row, artifact

    def _artifact_row(
        self,
        tenant: str,
        session_id: str,
        node: PathNode,
        artifact_id: str,
        calls: Mapping[str, tuple[str, Mapping[str, Any], str | None]],
        run: RunStart,
        now: datetime,
    ) -> dict[str, Any]:
        raw, content_type = tool_result_bytes(node.message.get("content"))
        text_content = raw.decode("utf-8", "replace")
        call_id = str(node.message.get("tool_call_id") or "")
        call_node_id, call, author = calls.get(call_id, (None, {}, None))
        function = call.get("function") or {}
        blob_key = None
        inline: bytes | None = raw
        if len(raw) > self.inline_max_bytes:
            blob_key = self.blobs.put(raw)  # fsynced before the row commits
            inline = None
        return {
            "id": artifact_id,
            "tenant": tenant,
            "node_id": node.id,
            "session_id": session_id,
            "tool_call_id": call_id,
            "tool_call_pk": tool_call_pk(call_node_id, call_id) if call_node_id else None,
            "tool_name": function.get("name"),
            "arguments": function.get("arguments"),
            "status": tool_result_status(text_content),
            "sha256": hashlib.sha256(raw).hexdigest(),
            "size_bytes": len(raw),
            "tokens": count_text(text_content),
            "content_type": content_type,
            "content": inline,
            "blob_key": blob_key,
            "owner_participant": author or run.participant,
            "privacy_class": None,
            "freshness_class": None,
            "captured_by_request": run.request_id,
            "observed_at": now,
        }

    def _call_rows(
        self, session: Session, tenant: str, node: PathNode, now: datetime
    ) -> list[dict[str, Any]]:
        tool_calls = node.message.get("tool_calls") or []
        if node.message.get("role") != "assistant" or not tool_calls:
            return []
        run_id = None
        if node.parent_id is not None:
            # The run whose request ended at this message's parent produced it.
            run_id = session.scalar(
                select(ModelRun.id)
                .where(ModelRun.tenant == tenant, ModelRun.leaf_node_id == node.parent_id)
                .order_by(ModelRun.started_at.desc())
                .limit(1)
            )
        rows = []
        for call in tool_calls:
            function = call.get("function") or {}
            call_id = str(call.get("id") or "")
            rows.append(
                {
                    "id": tool_call_pk(node.id, call_id),
                    "tenant": tenant,
                    "node_id": node.id,
                    "call_id": call_id,
                    "name": str(function.get("name") or ""),
                    "arguments": str(function.get("arguments") or ""),
                    "run_id": run_id,
                    "created_at": now,
                }
            )
        return rows

    def _insert_ignoring_conflicts(
        self, session: Session, model: type[Base], rows: list[dict[str, Any]]
    ) -> None:
        if not rows:
            return
        statement = self._insert(model).on_conflict_do_nothing()
        session.execute(statement, rows)

    def finish_run(
        self, request_id: str, outcome: RunOutcome, assembly: AssemblyRecord | None = None
    ) -> None:
        values: dict[str, Any] = {
            "status": outcome.status,
            "latency_ms": outcome.latency_ms,
            "http_status": outcome.http_status,
            "error_type": outcome.error_type,
            "error_message": outcome.error_message,
            "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "cached_tokens": outcome.cached_tokens,
            "total_tokens": outcome.total_tokens,
            "cost_usd": outcome.cost_usd,
            "cost_original_usd": outcome.cost_original_usd,
            "tokens_original": outcome.tokens_original,
            "tokens_forwarded": outcome.tokens_forwarded,
            "cache_write_tokens": outcome.cache_write_tokens,
            "finish_reason": outcome.finish_reason,
            "response_json": canonical_json(outcome.response) if outcome.response else None,
            "finished_at": self._now(),
        }
        with Session(self.engine) as session, session.begin():
            tenant = session.scalar(
                update(ModelRun).where(ModelRun.id == request_id).values(**values).returning(ModelRun.tenant)
            )
            if assembly is not None and tenant is not None:
                session.add(assembly_to_row(request_id, tenant, assembly))

    # -- reading -------------------------------------------------------------

    def get_artifact(self, artifact_id: str, tenant: str | None) -> ArtifactRecord | None:
        """The artifact, if it exists and `tenant` may see it (None: any tenant)."""
        with Session(self.engine) as session:
            query = select(ToolArtifact).where(ToolArtifact.id == artifact_id)
            if tenant is not None:
                query = query.where(ToolArtifact.tenant == tenant)
            row = session.scalar(query)
            return artifact_from_row(row) if row else None

    def get_call_arguments(self, artifact_id: str, tenant: str | None) -> tuple[str, dict[str, Any]] | None:
        """The raw arguments of a tool call served as an `args_...` artifact, and its metadata."""
        if not artifact_id.startswith("args_"):
            return None
        with Session(self.engine) as session:
            query = select(ToolCall).where(ToolCall.id == artifact_id[len("args_") :])
            if tenant is not None:
                query = query.where(ToolCall.tenant == tenant)
            row = session.scalar(query)
            if row is None:
                return None
            meta = {
                "id": artifact_id, "object": "tool_call_arguments", "tenant": row.tenant,
                "node_id": row.node_id, "tool_call_id": row.call_id, "tool_name": row.name,
                "run_id": row.run_id, "sha256": hashlib.sha256(row.arguments.encode("utf-8", "surrogatepass")).hexdigest(),
                "bytes": len(row.arguments.encode("utf-8", "surrogatepass")),
            }
            return row.arguments, meta

    def artifact_bytes(self, record: ArtifactRecord) -> bytes:
        """The raw bytes, checked against the recorded sha256."""
        if record.blob_key:
            data = self.blobs.get(record.blob_key)
        else:
            with Session(self.engine) as session:
                data = session.scalar(
                    select(ToolArtifact.content).where(ToolArtifact.id == record.id)
                ) or b""
        if hashlib.sha256(data).hexdigest() != record.sha256:
            raise ArtifactCorrupted(record.id)
        return data

    def forwarded_messages(self, request_id: str, tenant: str | None) -> list[dict[str, Any]] | None:
        """The messages the projection forwarded for a request, if recorded."""
        with Session(self.engine) as session:
            query = select(ContextAssembly.forwarded_zlib).where(ContextAssembly.request_id == request_id)
            if tenant is not None:
                query = query.where(ContextAssembly.tenant == tenant)
            blob = session.scalar(query)
            return json.loads(zlib.decompress(blob)) if blob else None

    def get_run(self, request_id: str, tenant: str | None) -> RunRecord | None:
        with Session(self.engine) as session:
            query = select(ModelRun).where(ModelRun.id == request_id)
            if tenant is not None:
                query = query.where(ModelRun.tenant == tenant)
            row = session.scalar(query)
            if row is None:
                return None
            captured = session.scalars(
                select(ToolArtifact)
                .where(ToolArtifact.captured_by_request == request_id)
                .order_by(ToolArtifact.observed_at, ToolArtifact.id)
            ).all()
            assembly = session.get(ContextAssembly, request_id)
            return RunRecord(
                run=run_as_dict(row),
                captured_artifacts=tuple(artifact_from_row(a) for a in captured),
                path_artifact_ids=tuple(self._path_artifact_ids(session, row.leaf_node_id)),
                assembly=assembly_from_row(assembly) if assembly else None,
            )

    def _path_artifact_ids(self, session: Session, leaf_id: str) -> list[str]:
        rows = session.execute(
            text(
                "WITH RECURSIVE path(id, parent_id, artifact_id, depth) AS ("
                " SELECT id, parent_id, artifact_id, depth FROM message_nodes WHERE id = :leaf"
                " UNION ALL"
                " SELECT n.id, n.parent_id, n.artifact_id, n.depth"
                " FROM message_nodes n JOIN path p ON n.id = p.parent_id)"
                " SELECT artifact_id FROM path WHERE artifact_id IS NOT NULL ORDER BY depth"
            ),
            {"leaf": leaf_id},
        )
        return [r[0] for r in rows]

    def savings_rows(
        self,
        tenant: str | None,
        start: datetime | None = None,
        end: datetime | None = None,
        model: str | None = None,
        session_key: str | None = None,
    ) -> list[dict[str, Any]]:
        """The ledger's raw material: finished runs summed per tenant, model, session and day."""
        session_col = func.coalesce(ModelRun.session_label, ModelRun.conversation_id, ModelRun.session_id)
        day = func.date(ModelRun.started_at)
        query = (
            select(
                ModelRun.tenant, ModelRun.model, session_col, day,
                func.count(), func.sum(ModelRun.tokens_original), func.sum(ModelRun.tokens_forwarded),
                func.sum(ModelRun.prompt_tokens), func.sum(ModelRun.cached_tokens),
                func.sum(ModelRun.cache_write_tokens), func.sum(ModelRun.completion_tokens),
                func.sum(ModelRun.cost_usd), func.sum(ModelRun.cost_original_usd),
                func.min(ModelRun.started_at), func.max(ModelRun.started_at),
            )
            .where(ModelRun.status == "ok")
            .group_by(ModelRun.tenant, ModelRun.model, session_col, day)
        )
        if tenant is not None:
            query = query.where(ModelRun.tenant == tenant)
        if start is not None:
            query = query.where(ModelRun.started_at >= start)
        if end is not None:
            query = query.where(ModelRun.started_at < end)
        if model is not None:
            query = query.where(ModelRun.model == model)
        if session_key is not None:
            query = query.where(session_col == session_key)
        keys = ("tenant", "model", "session", "day", "requests", "tokens_sent", "tokens_forwarded",
                "prompt_tokens", "cached_tokens", "cache_write_tokens", "completion_tokens",
                "cost_usd", "cost_original_usd", "first_at", "last_at")
        with Session(self.engine) as session:
            rows = []
            for values in session.execute(query):
                row = dict(zip(keys, values))
                row["day"] = str(row["day"])[:10]
                row["first_at"] = as_utc(row["first_at"]).isoformat()
                row["last_at"] = as_utc(row["last_at"]).isoformat()
                rows.append(row)
            return rows

    def recent_runs(self, tenant: str | None, limit: int = 50, session_key: str | None = None) -> list[dict[str, Any]]:
        """The latest runs, newest first, for the dashboard's tables."""
        query = select(ModelRun).order_by(ModelRun.started_at.desc()).limit(limit)
        if tenant is not None:
            query = query.where(ModelRun.tenant == tenant)
        if session_key is not None:
            query = query.where(
                func.coalesce(ModelRun.session_label, ModelRun.conversation_id, ModelRun.session_id) == session_key
            )
        with Session(self.engine) as session:
            return [run_as_dict(row) for row in session.scalars(query)]

    def path_messages(self, leaf_id: str) -> list[dict[str, Any]]:
        """The transcript a request carried, rebuilt from its nodes and artifacts."""
        with Session(self.engine) as session:
            ids = session.execute(
                text(
                    "WITH RECURSIVE path(id, parent_id, depth) AS ("
                    " SELECT id, parent_id, depth FROM message_nodes WHERE id = :leaf"
                    " UNION ALL SELECT n.id, n.parent_id, n.depth FROM message_nodes n"
                    " JOIN path p ON n.id = p.parent_id) SELECT id FROM path ORDER BY depth"
                ),
                {"leaf": leaf_id},
            ).scalars().all()
            nodes = {n.id: n for n in session.scalars(select(MessageNode).where(MessageNode.id.in_(ids)))}
            artifacts = {
                a.id: a for a in session.scalars(
                    select(ToolArtifact).where(ToolArtifact.id.in_([n.artifact_id for n in nodes.values() if n.artifact_id]))
                )
            }
            messages = []
            for node_id in ids:
                node = nodes[node_id]
                message = json.loads(node.message_json)
                if node.artifact_id and node.artifact_id in artifacts:
                    record = artifact_from_row(artifacts[node.artifact_id])
                    raw = self.artifact_bytes(record)
                    message["content"] = raw.decode("utf-8", "replace") if record.content_type.startswith("text/") \
                        else json.loads(raw)
                    message["artifact_id"] = node.artifact_id
                messages.append(message)
            return messages

    def delete_session(self, tenant: str, session_key: str) -> dict[str, int]:
        """Delete a conversation: its runs, assemblies, tool calls, artifacts and message tree.

        `session_key` is a session id (the tree's root) or a label sent in a session
        header (every tree carrying it). Blobs go when no artifact of any tenant still
        names them (they are shared by content). Returns the rows deleted, by table.
        """
        with Session(self.engine) as session, session.begin():
            roots = set(session.scalars(
                select(ModelRun.session_id).where(
                    ModelRun.tenant == tenant,
                    (ModelRun.session_id == session_key) | (ModelRun.session_label == session_key),
                )
            ))
            roots |= set(session.scalars(
                select(MessageNode.session_id).where(MessageNode.tenant == tenant, MessageNode.id == session_key)
            ))
            if not roots:
                return {}
            runs = select(ModelRun.id).where(ModelRun.tenant == tenant, ModelRun.session_id.in_(roots))
            nodes = select(MessageNode.id).where(MessageNode.tenant == tenant, MessageNode.session_id.in_(roots))
            blob_keys = set(session.scalars(
                select(ToolArtifact.blob_key).where(ToolArtifact.tenant == tenant, ToolArtifact.session_id.in_(roots),
                                                    ToolArtifact.blob_key.is_not(None))
            ))
            counts = {
                "context_assemblies": session.execute(
                    delete(ContextAssembly).where(ContextAssembly.request_id.in_(runs))).rowcount,
                "tool_artifacts": session.execute(
                    delete(ToolArtifact).where(ToolArtifact.tenant == tenant, ToolArtifact.session_id.in_(roots))
                ).rowcount,
                "tool_calls": session.execute(delete(ToolCall).where(ToolCall.node_id.in_(nodes))).rowcount,
                "model_runs": session.execute(
                    delete(ModelRun).where(ModelRun.tenant == tenant, ModelRun.session_id.in_(roots))).rowcount,
                "message_nodes": session.execute(
                    delete(MessageNode).where(MessageNode.tenant == tenant, MessageNode.session_id.in_(roots))
                ).rowcount,
            }
            still_named = set(session.scalars(
                select(ToolArtifact.blob_key).where(ToolArtifact.blob_key.in_(blob_keys))
            )) if blob_keys else set()
        removed = 0
        for key in blob_keys - still_named:  # after the commit: a crash leaves an orphan file, never a dangling row
            removed += self.blobs.delete(key)
        counts["blobs"] = removed
        return counts

    def count_artifacts(self, tenant: str | None = None) -> int:
        with Session(self.engine) as session:
            query = select(func.count()).select_from(ToolArtifact)
            if tenant is not None:
                query = query.where(ToolArtifact.tenant == tenant)
            return int(session.scalar(query) or 0)

    def iter_tool_calls(self, tenant: str) -> Iterable[dict[str, Any]]:
        with Session(self.engine) as session:
            for row in session.scalars(select(ToolCall).where(ToolCall.tenant == tenant)):
                yield {
                    "id": row.id,
                    "node_id": row.node_id,
                    "call_id": row.call_id,
                    "name": row.name,
                    "arguments": row.arguments,
                    "run_id": row.run_id,
                }
