"""conversations.incarnation: which life of a conversation's records a process's cache was read in

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03 00:00:00

A capture reads the facts of every artifact on its path (when each was observed, who owns it,
whether a model had it back whole). A process keeps them per conversation, valid for one value of
this column, which a capture reads under the conversation's row lock: a row made anew (after a
deletion) gets a random one, and retention's claims and rehydration marks move it on, so no
replica reuses what changed under it (storage/path_reads.py `PathFacts`). Existing rows start at 0.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("incarnation", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.drop_column("incarnation")
