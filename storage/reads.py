"""The record store's read side: artifacts, runs, assemblies, the ledger's rows, transcripts."""
from __future__ import annotations

import hashlib
import json
import re
import zlib
from datetime import datetime
from typing import Any, Iterable

from sqlalchemy import and_, func, select, text
from sqlalchemy.orm import Session

from policies.transcript import SHORT_REF_HEX
from storage.assembly_record import MAX_BASE_DEPTH, assembly_from_row, merged_decisions
from storage.encryption import Tampered, call_arguments_aad, forwarded_aad, node_aad, projection_aad
from storage.ledger import ROW_KEYS, ledger_rows, merged, run_sums, session_key_column
from storage.record_types import (
    ArtifactCorrupted,
    ArtifactRecord,
    RunRecord,
    artifact_from_row,
    run_as_dict,
)
from storage.schema import (ContextAssembly, ForwardedMessage, MessageNode, ModelRun, SavingsLedgerDay, ToolArtifact,
                            ToolCall)
from storage.store_base import StoreBase


_ARTIFACT_ID_CHARS = 24  # art_ and 20 hex digits (policies.transcript.artifact_id_for)
_CALL_ID_CHARS = 32  # a tool call's key: 32 hex digits (policies.transcript.tool_call_pk)


def _naming(column: Any, reference: str, full_length: int) -> Any:
    """The rows `reference` names: the id itself, or, for a short reference (a prefix of at least
    SHORT_REF_HEX hex digits), the ids it begins; as a range, which an index serves on every database."""
    digits = reference.partition("_")[2] if reference.startswith("art_") else reference
    if len(reference) >= full_length or len(digits) < SHORT_REF_HEX or not _HEX.match(digits):
        return column == reference
    return and_(column >= reference, column < reference[:-1] + chr(ord(reference[-1]) + 1))


_HEX = re.compile(r"^[0-9a-f]+$")


class Reads(StoreBase):
    def get_artifact(self, artifact_id: str, tenant: str | None) -> ArtifactRecord | None:
        """The artifact, if it exists and `tenant` may see it (None: any tenant). `artifact_id` may be the
        short reference memories use (`policies.transcript.short_ref`) when it names one artifact only."""
        with Session(self.engine) as session:
            query = select(ToolArtifact).where(_naming(ToolArtifact.id, artifact_id, _ARTIFACT_ID_CHARS))
            if tenant is not None:
                query = query.where(ToolArtifact.tenant == tenant)
            rows = session.scalars(query.limit(2)).all()
            return artifact_from_row(rows[0], self.encryption) if len(rows) == 1 else None

    def get_call_arguments(self, artifact_id: str, tenant: str | None) -> tuple[str, dict[str, Any]] | None:
        """The raw arguments of a tool call served as an `args_...` artifact, and its metadata."""
        if not artifact_id.startswith("args_"):
            return None
        with Session(self.engine) as session:
            query = select(ToolCall).where(_naming(ToolCall.id, artifact_id[len("args_"):], _CALL_ID_CHARS))
            if tenant is not None:
                query = query.where(ToolCall.tenant == tenant)
            rows = session.scalars(query.limit(2)).all()
            if len(rows) != 1:
                return None
            row = rows[0]
            arguments = self._call_arguments(row)
            raw = arguments.encode("utf-8", "surrogatepass")
            meta = {
                "id": f"args_{row.id}", "object": "tool_call_arguments", "tenant": row.tenant,
                "node_id": row.node_id, "tool_call_id": row.call_id, "tool_name": row.name,
                "run_id": row.run_id, "sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw),
            }
            return arguments, meta

    def _call_arguments(self, row: ToolCall) -> str:
        return self.encryption.open_text(row.arguments, call_arguments_aad(row.id), row.key_id) or ""

    def artifact_bytes(self, record: ArtifactRecord) -> bytes:
        """The raw bytes, checked against the recorded sha256 (after opening them, if sealed).

        UnknownKey (storage/encryption.py) if they were sealed under a key this store was not given."""
        if record.blob_key:
            return self._checked_bytes(record, b"")
        with Session(self.engine) as session:
            stored = session.scalar(select(ToolArtifact.content).where(ToolArtifact.id == record.id))
        return self._checked_bytes(record, stored or b"")

    def _checked_bytes(self, record: ArtifactRecord, stored: bytes) -> bytes:
        """`artifact_bytes` of an artifact whose row's content is `stored` (ignored for a blob)."""
        if record.blob_key:
            data = self.sealed_blobs.get(record.blob_key)
        else:
            try:
                data = self.encryption.open_artifact(stored, record.sha256)
            except Tampered as exc:
                raise ArtifactCorrupted(record.id) from exc
        if hashlib.sha256(data).hexdigest() != record.sha256:
            raise ArtifactCorrupted(record.id)
        return data

    def forwarded_messages(self, request_id: str, tenant: str | None) -> list[dict[str, Any]] | None:
        """The messages the projection forwarded for a request, if recorded: the request's path,
        with each message a decision replaced swapped for what was forwarded, omitted ones left out."""
        with Session(self.engine) as session:
            query = select(ContextAssembly, ModelRun.leaf_node_id, ModelRun.conversation_id).join(
                ModelRun, ModelRun.id == ContextAssembly.request_id).where(ContextAssembly.request_id == request_id)
            if tenant is not None:
                query = query.where(ContextAssembly.tenant == tenant)
            found = session.execute(query).first()
            if found is None:
                return None
            assembly, leaf, conversation = found
            if assembly.forwarded_zlib:  # recorded whole (before the projection was rebuilt on demand)
                return json.loads(zlib.decompress(
                    self.encryption.open(assembly.forwarded_zlib, projection_aad(assembly.request_id))))
            decisions = merged_decisions(self._assembly_chain(session, assembly))
            digests = [d["forwarded"] for d in decisions.values() if d.get("forwarded")]
            replaced = {}
            for start in range(0, len(digests), 500):
                rows = session.execute(select(ForwardedMessage.digest, ForwardedMessage.message_zlib).where(
                    ForwardedMessage.conversation_id == (conversation or request_id),
                    ForwardedMessage.digest.in_(digests[start:start + 500])))
                replaced.update((digest, self.encryption.open(data, forwarded_aad(digest))) for digest, data in rows)
        messages = []
        for index, message in enumerate(self.path_messages(leaf)):
            decision = decisions.get(index, {})
            if decision.get("action") == "omitted":
                continue
            if decision.get("forwarded") in replaced:
                messages.append(json.loads(zlib.decompress(replaced[decision["forwarded"]])))
            else:
                messages.append({k: v for k, v in message.items() if k != "artifact_id"})
        return messages

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
            path = self._path_roles(session, row.leaf_node_id)
            chain = self._assembly_chain(session, assembly) if assembly else []
            return RunRecord(
                run=run_as_dict(row, self.encryption),
                captured_artifacts=tuple(artifact_from_row(a, self.encryption) for a in captured),
                path_artifact_ids=tuple(artifact for _, artifact in path if artifact is not None),
                assembly=assembly_from_row(assembly, [role for role, _ in path], chain) if assembly else None,
            )

    def _assembly_chain(self, session: Session, assembly: ContextAssembly) -> list[ContextAssembly]:
        """`assembly` and the bases its stored decisions extend, nearest first (same tenant only)."""
        chain = [assembly]
        while chain[-1].base_request_id is not None and len(chain) <= MAX_BASE_DEPTH:
            base = session.get(ContextAssembly, chain[-1].base_request_id)
            if base is None or base.tenant != assembly.tenant:
                break  # collected or foreign: what is stored is what can be shown
            chain.append(base)
        return chain

    def _path_roles(self, session: Session, leaf_id: str) -> list[tuple[str, str | None]]:
        """(role, artifact id) of every message of the path ending at `leaf_id`, in order."""
        rows = session.execute(
            text(
                "WITH RECURSIVE path(id, parent_id, role, artifact_id, depth) AS ("
                " SELECT id, parent_id, role, artifact_id, depth FROM message_nodes WHERE id = :leaf"
                " UNION ALL"
                " SELECT n.id, n.parent_id, n.role, n.artifact_id, n.depth"
                " FROM message_nodes n JOIN path p ON n.id = p.parent_id)"
                " SELECT role, artifact_id FROM path ORDER BY depth"
            ),
            {"leaf": leaf_id},
        )
        return [(r[0], r[1]) for r in rows]

    def savings_rows(
        self,
        tenant: str | None,
        start: datetime | None = None,
        end: datetime | None = None,
        model: str | None = None,
        session_key: str | None = None,
    ) -> list[dict[str, Any]]:
        """The ledger's raw material: finished runs summed per tenant, model, session and day, with
        the rows garbage collection rolled up before it removed runs (storage/ledger.py)."""
        session_col = session_key_column()
        query = run_sums()
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
        with self.engine.connect() as connection:
            detail = [dict(zip(ROW_KEYS, values)) for values in connection.execute(query)]
            rolled_up = ledger_rows(connection, tenant, start, end, model, session_key)
        return merged(rolled_up, detail)

    def models_used(self, tenant: str) -> list[str]:
        """The models a tenant's runs name, kept or rolled up into the ledger, sorted."""
        with self.engine.connect() as connection:
            kept = connection.scalars(select(ModelRun.model).where(ModelRun.tenant == tenant).distinct())
            rolled = connection.scalars(select(SavingsLedgerDay.model)
                                        .where(SavingsLedgerDay.tenant == tenant).distinct())
            return sorted(set(kept) | set(rolled))

    def recent_runs(self, tenant: str | None, limit: int = 50, session_key: str | None = None) -> list[dict[str, Any]]:
        """The latest runs, newest first, for the dashboard's tables."""
        query = select(ModelRun).order_by(ModelRun.started_at.desc()).limit(limit)
        if tenant is not None:
            query = query.where(ModelRun.tenant == tenant)
        if session_key is not None:
            query = query.where(
                func.coalesce(ModelRun.session_label, ModelRun.conversation_id, ModelRun.tree_id) == session_key
            )
        with Session(self.engine) as session:
            return [run_as_dict(row, self.encryption) for row in session.scalars(query)]

    def path_messages(self, leaf_id: str) -> list[dict[str, Any]]:
        """The transcript a request carried, rebuilt from its nodes and artifacts: one statement (the
        path walked from its leaf, its artifacts joined), whatever the path's length."""
        path = _path_to(leaf_id)
        with Session(self.engine) as session:
            rows = session.execute(
                select(path.c.id, path.c.key_id, path.c.message_json, path.c.artifact_id, ToolArtifact)
                .outerjoin(ToolArtifact, ToolArtifact.id == path.c.artifact_id).order_by(path.c.depth))
            messages = []
            for node_id, key_id, message_json, artifact_id, artifact in rows:
                message = json.loads(self.encryption.open_text(message_json, node_aad(node_id), key_id))
                if artifact is not None:
                    record = artifact_from_row(artifact, self.encryption)
                    raw = self._checked_bytes(record, artifact.content or b"")  # the row read here
                    message["content"] = raw.decode("utf-8", "replace") if record.content_type.startswith("text/") \
                        else json.loads(raw)
                    message["artifact_id"] = artifact_id
                messages.append(message)
            return messages

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
                    "arguments": self._call_arguments(row),
                    "run_id": row.run_id,
                }


def _path_to(leaf_id: str) -> Any:
    """The nodes of the path that ends at `leaf_id` (id, parent, depth, message, artifact id), as a
    recursive CTE walked up from the leaf."""
    nodes = MessageNode.__table__
    columns = ("id", "parent_id", "depth", "key_id", "message_json", "artifact_id")
    path = select(*(nodes.c[name] for name in columns)).where(nodes.c.id == leaf_id).cte("path", recursive=True)
    parent = nodes.alias("parent")
    return path.union_all(select(*(parent.c[name] for name in columns)).join(path, parent.c.id == path.c.parent_id))
