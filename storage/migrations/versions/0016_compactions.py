"""compactions: every remote compaction a client asked for

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 09:00:00

Codex compacts its context remotely (a `compaction_trigger` item in a Responses request, or
`POST /v1/responses/compact`); the gateway forwards it to a provider that has the endpoint, or
answers it with a signed reference to the transcript it captured. Each one is a row of
`compactions` (tenant, run, conversation, which of the two, the sizes in and out).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "compactions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("endpoint", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("input_items", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("forwarded_tokens", sa.Integer(), nullable=False),
        sa.Column("output_items", sa.Integer(), nullable=False),
        sa.Column("output_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("compactions", schema=None) as batch_op:
        for column in ("tenant", "request_id", "conversation_id", "created_at"):
            batch_op.create_index(batch_op.f(f"ix_compactions_{column}"), [column], unique=False)


def downgrade() -> None:
    op.drop_table("compactions")
