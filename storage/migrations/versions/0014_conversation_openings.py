"""the node a conversation is named by

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 10:00:00

The dashboard names an unlabelled conversation by its first user message: `conversations` records the
node of that message when capture creates the row. Before this revision an unlabelled conversation's id
was the node of its first message after the system prompt, so rows whose id is a user message's node
are given that node; the others (labelled conversations, named by their label, and the rare ones that
opened with another role) keep NULL and are shown by their id.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("conversations", sa.Column("opening_node_id", sa.String(length=64), nullable=True))
    op.execute(
        "UPDATE conversations SET opening_node_id = id WHERE EXISTS (SELECT 1 FROM message_nodes"
        " WHERE message_nodes.id = conversations.id AND message_nodes.role = 'user')"
    )


def downgrade() -> None:
    op.drop_column("conversations", "opening_node_id")
