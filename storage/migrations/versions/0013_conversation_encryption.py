"""key ids of the conversation columns encryption at rest seals

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 10:00:00

With `storage.encryption_key` set, a message node's JSON, a tool call's arguments and a run's answer
and error message are sealed as well as tool results (storage/encryption.py): each such row records
the key it was written under, so a reader knows its text is an envelope and `gateway keys rotate`
finds what is not under the current key yet. Rows stored before are in the clear (key_id NULL) and
read as they are; the same command seals them.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_TABLES = ("message_nodes", "tool_calls", "model_runs")


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(table, sa.Column("key_id", sa.String(length=16), nullable=True))


def downgrade() -> None:
    # Not in a batch: on SQLite (3.35 and later drop a column in place) a batch copies the table, and
    # message_nodes, which other tables' rows reference, cannot be dropped and made again.
    for table in reversed(_TABLES):
        op.drop_column(table, "key_id")
