"""conversations as the unit of storage; the blob registry; serving instances

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 04:00:00

- `conversation_nodes`: which conversation uses which message node. Backfilled
  from every run's path, so deleting one conversation leaves the nodes other
  conversations use.
- `model_runs.conversation_id` becomes the conversation key for every run: a
  labelled run's is `conv_<hash of tenant and label>` (it was the first node).
- `blobs`: one row per blob file, the lock capture and collection share;
  backfilled from the artifacts that name blobs.
- `gateway_instances`, `model_runs.instance_id`, `model_runs.wire_format`.
"""
from __future__ import annotations

import hashlib
from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_ANCESTORS = sa.text(
    "WITH RECURSIVE path(id, parent_id) AS ("
    " SELECT id, parent_id FROM message_nodes WHERE id = :leaf"
    " UNION ALL SELECT n.id, n.parent_id FROM message_nodes n JOIN path p ON n.id = p.parent_id)"
    " SELECT id FROM path"
)
_FIRST_AFTER_SYSTEM = sa.text(
    "WITH RECURSIVE path(id, parent_id, depth, role) AS ("
    " SELECT id, parent_id, depth, role FROM message_nodes WHERE id = :leaf"
    " UNION ALL SELECT n.id, n.parent_id, n.depth, n.role FROM message_nodes n JOIN path p ON n.id = p.parent_id)"
    " SELECT id, role FROM path ORDER BY depth"
)


def _label_conversation(tenant: str, label: str) -> str:
    # The same as policies.transcript.conversation_id_for; a migration keeps its own copy.
    digest = hashlib.blake2b(f"{tenant}\x00{label}".encode("utf-8", "surrogatepass"), digest_size=16)
    return f"conv_{digest.hexdigest()}"


def upgrade() -> None:
    op.create_table(
        "conversation_nodes",
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["message_nodes.id"]),
        sa.PrimaryKeyConstraint("conversation_id", "node_id"),
    )
    with op.batch_alter_table("conversation_nodes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_conversation_nodes_node_id"), ["node_id"], unique=False)
    op.create_table(
        "blobs",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_table(
        "gateway_instances",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("host", sa.String(length=256), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("gateway_instances", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gateway_instances_heartbeat_at"), ["heartbeat_at"], unique=False)
    with op.batch_alter_table("model_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("wire_format", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("instance_id", sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f("ix_model_runs_status"), ["status"], unique=False)
    with op.batch_alter_table("tool_artifacts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tool_artifacts_blob_key"), ["blob_key"], unique=False)
    _backfill(op.get_bind())


def _backfill(bind: sa.Connection) -> None:
    runs = sa.table("model_runs", sa.column("id"), sa.column("tenant"), sa.column("session_label"),
                    sa.column("conversation_id"), sa.column("leaf_node_id"), sa.column("wire_format"))
    bind.execute(runs.update().values(wire_format="openai.chat"))
    for run_id, tenant, label, conversation, leaf in bind.execute(
            sa.select(runs.c.id, runs.c.tenant, runs.c.session_label, runs.c.conversation_id, runs.c.leaf_node_id)):
        if label:
            conversation = _label_conversation(tenant, label)
        elif conversation is None:
            path = list(bind.execute(_FIRST_AFTER_SYSTEM, {"leaf": leaf}))
            conversation = next((node for node, role in path if role not in ("system", "developer")),
                                path[-1][0] if path else leaf)
        bind.execute(runs.update().where(runs.c.id == run_id).values(conversation_id=conversation))
    members = sa.table("conversation_nodes", sa.column("conversation_id"), sa.column("node_id"))
    seen: set[tuple[str, str]] = set()
    for conversation, leaf in bind.execute(sa.select(runs.c.conversation_id, runs.c.leaf_node_id).distinct()):
        rows = [{"conversation_id": conversation, "node_id": node}
                for (node,) in bind.execute(_ANCESTORS, {"leaf": leaf}) if (conversation, node) not in seen]
        seen.update((conversation, row["node_id"]) for row in rows)
        if rows:
            bind.execute(members.insert(), rows)
    artifacts = sa.table("tool_artifacts", sa.column("blob_key"), sa.column("size_bytes"))
    blobs = sa.table("blobs", sa.column("key"), sa.column("size_bytes"), sa.column("created_at"))
    now = datetime.now(timezone.utc)
    rows = [{"key": key, "size_bytes": size, "created_at": now} for key, size in bind.execute(
        sa.select(artifacts.c.blob_key, sa.func.max(artifacts.c.size_bytes))
        .where(artifacts.c.blob_key.is_not(None)).group_by(artifacts.c.blob_key))]
    if rows:
        bind.execute(blobs.insert(), rows)


def downgrade() -> None:
    with op.batch_alter_table("tool_artifacts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tool_artifacts_blob_key"))
    with op.batch_alter_table("model_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_runs_status"))
        batch_op.drop_column("instance_id")
        batch_op.drop_column("wire_format")
    op.drop_table("gateway_instances")
    op.drop_table("blobs")
    op.drop_table("conversation_nodes")
