"""keys made through the API, and the key each run came with

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 10:00:00

`api_keys` holds keys made by `POST /api/keys` as sha256 digests (never the
key), with their tenant, expiry, revocation, models, budget and limits.
`model_runs.api_key_id` names the key a run came with, so spend can be summed
per key; runs recorded before stay NULL.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=True),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("models", sa.JSON(), nullable=True),
        sa.Column("budget", sa.JSON(), nullable=True),
        sa.Column("limits", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("digest"),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_tenant"), ["tenant"], unique=False)
    with op.batch_alter_table("model_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("api_key_id", sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f("ix_model_runs_api_key_id"), ["api_key_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("model_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_runs_api_key_id"))
        batch_op.drop_column("api_key_id")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_tenant"))
    op.drop_table("api_keys")
