"""artifacts redacted before they are stored keep their original's hash

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30 10:30:00

With a policy's `redaction.stored` on, a tool result is redacted before it is
written: `tool_artifacts.sha256` is then the stored bytes' (integrity checks
read those), `original_sha256` the captured original's, and `redacted_json`
what was replaced ({kind: count}). Both are NULL for an artifact stored as sent.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tool_artifacts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("original_sha256", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("redacted_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tool_artifacts", schema=None) as batch_op:
        batch_op.drop_column("redacted_json")
        batch_op.drop_column("original_sha256")
