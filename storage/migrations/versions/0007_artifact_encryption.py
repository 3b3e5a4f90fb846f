"""key ids of what encryption at rest sealed

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 10:00:00

With `storage.encryption_key` set, an inline artifact's content, a blob file,
a forwarded message and an old assembly's stored projection are AES-GCM
envelopes (storage/encryption.py). Each row records the key it was sealed
under, so `gateway keys rotate` finds what is not under the current key yet.
Rows stored before are in the clear (key_id NULL) and read as they are.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_TABLES = ("tool_artifacts", "blobs", "forwarded_messages", "context_assemblies")


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("key_id", sa.String(length=16), nullable=True))


def downgrade() -> None:
    for table in reversed(_TABLES):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("key_id")
