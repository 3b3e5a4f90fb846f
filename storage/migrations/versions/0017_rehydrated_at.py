"""tool_artifacts.rehydrated_at: when a model first had the artifact back whole

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02 20:00:00

A model that asked for an artifact through the gateway's rehydration tool needed more than its
memory; the gateway forwards it whole on the conversation's later requests instead of hiding it
again (policies/assembler.py `_rehydrate_named`). Read with the artifact's other facts, on the
request path, in the same statement.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tool_artifacts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rehydrated_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tool_artifacts", schema=None) as batch_op:
        batch_op.drop_column("rehydrated_at")
