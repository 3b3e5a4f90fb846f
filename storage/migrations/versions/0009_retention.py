"""retention: conversations' last activity, the daily savings ledger, tenant purge audit

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30 10:00:00

- `conversations`: one row per conversation with its last activity, which
  every retention lifetime counts from; backfilled from the runs (the latest
  run's start is the last activity).
- `savings_ledger`: finished runs rolled up per tenant, day, model and session
  before garbage collection removes them.
- `tenant_purges`: the audit entry of each tenant purge.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_active_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("collected", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_conversations_tenant"), ["tenant"], unique=False)
        batch_op.create_index("ix_conversations_tenant_last_active", ["tenant", "last_active_at"], unique=False)
    op.execute(
        "INSERT INTO conversations (id, tenant, created_at, last_active_at, collected)"
        " SELECT conversation_id, MIN(tenant), MIN(started_at), MAX(started_at), 0 FROM model_runs"
        " WHERE conversation_id IS NOT NULL GROUP BY conversation_id"
    )
    op.create_table(
        "savings_ledger",
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("day", sa.String(length=10), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("session", sa.String(length=256), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("tokens_sent", sa.BigInteger(), nullable=True),
        sa.Column("tokens_forwarded", sa.BigInteger(), nullable=True),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=True),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=True),
        sa.Column("cache_write_tokens", sa.BigInteger(), nullable=True),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("cost_original_usd", sa.Float(), nullable=True),
        sa.Column("first_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "day", "model", "session"),
    )
    op.create_table(
        "tenant_purges",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("actor", sa.String(length=256), nullable=False),
        sa.Column("purged_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("counts_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("tenant_purges", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tenant_purges_tenant"), ["tenant"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tenant_purges", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tenant_purges_tenant"))
    op.drop_table("tenant_purges")
    op.drop_table("savings_ledger")
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.drop_index("ix_conversations_tenant_last_active")
        batch_op.drop_index(batch_op.f("ix_conversations_tenant"))
    op.drop_table("conversations")
