"""a subagent run's parent's conversation, indexed

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30 19:10:00

The results of a conversation's subagent runs were found by reading every run of the conversation and
looking for children of each (0.08 / 0.23 / 0.99 ms at 100 / 1,000 / 5,000 runs on SQLite, on every
request). A child run now names its parent's conversation (a run's conversation never changes), and
the lookup reads the children alone. Existing children are filled in from their parents.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_runs") as batch:
        batch.add_column(sa.Column("parent_conversation_id", sa.String(length=64), nullable=True))
        batch.create_index("ix_model_runs_parent_conversation_id", ["parent_conversation_id"], unique=False)
    op.execute(
        "UPDATE model_runs SET parent_conversation_id = (SELECT parent.conversation_id FROM model_runs AS parent"
        " WHERE parent.id = model_runs.parent_request_id AND parent.tenant = model_runs.tenant)"
        " WHERE parent_request_id IS NOT NULL"
    )


def downgrade() -> None:
    with op.batch_alter_table("model_runs") as batch:
        batch.drop_index("ix_model_runs_parent_conversation_id")
        batch.drop_column("parent_conversation_id")
