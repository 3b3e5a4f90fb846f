"""forwarded messages stored once per conversation

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 07:00:00

An assembly no longer stores its whole projection: it stores the decisions
that are not `verbatim` and differ from those of its base (the earlier request
on the same path, `context_assemblies.base_request_id`), each naming by digest
the message it forwarded in place of the client's, and `forwarded_messages`
holds each such message once per conversation. What a request writes no
longer grows with its transcript. Assemblies recorded before keep their
`forwarded_zlib`.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "forwarded_messages",
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("message_zlib", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", "digest"),
    )
    with op.batch_alter_table("forwarded_messages", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_forwarded_messages_tenant"), ["tenant"], unique=False)
    with op.batch_alter_table("context_assemblies", schema=None) as batch_op:
        batch_op.add_column(sa.Column("base_request_id", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("context_assemblies", schema=None) as batch_op:
        batch_op.drop_column("base_request_id")
    with op.batch_alter_table("forwarded_messages", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_forwarded_messages_tenant"))
    op.drop_table("forwarded_messages")
