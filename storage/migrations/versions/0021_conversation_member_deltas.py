"""conversation_member_deltas: the tool results a capture added under a share lock (PostgreSQL)

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04 16:00:00

On PostgreSQL a capture of an active conversation only share-locks its row, so it could not add what
it inserted to `conversations.artifact_members`, and every request counted the conversation's tool
results with a join over all its memberships: 2.2 of the 2.5 ms the statement after a capture took at
1,000 messages (bench/statement_times.py --explain). Such a capture now leaves a row here with what it
added, in the statement that inserts the memberships; the count is the column plus these rows, folded
into the column by the next capture that holds the row exclusively, or into one row by a capture that
finds many. SQLite keeps adding to the column (one writer holds the row anyway) and leaves this table
empty.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversation_member_deltas",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("added", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("conversation_member_deltas", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_conversation_member_deltas_conversation_id"), ["conversation_id"],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table("conversation_member_deltas", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_conversation_member_deltas_conversation_id"))
    op.drop_table("conversation_member_deltas")
