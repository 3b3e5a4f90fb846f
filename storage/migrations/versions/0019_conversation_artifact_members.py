"""conversations.artifact_members: how many of the conversation's messages are tool results

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03 10:00:00

The assembly names how many artifacts a conversation holds off the request's path (sibling branches).
Counted on every request, that was a join over every membership of the conversation: a cost that
grew with it (0.6 ms of SQLite per request at 1,000 messages, measured with bench/statement_times.py).
A capture now adds what it inserts to this column, under the conversation's row lock. NULL is "not
counted yet": existing rows, new ones, and those retention claims (whose records are about to go);
the next capture counts once and stores the figure.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("artifact_members", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.drop_column("artifact_members")
