"""dashboard sessions recorded server-side

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 09:00:00

A dashboard sign-in was a signed cookie alone: it kept working after sign-out and after its key was
revoked, until it expired. Each sign-in is now a row of `dashboard_sessions` (the sha256 of the
session id the cookie carries, the key that signed in, its tenant and expiry) that every replica
reads; signing out, revoking the key or removing it from the config deletes the row. Cookies issued
before carry no session id: their browsers sign in again.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("dashboard_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_dashboard_sessions_key_id"), ["key_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_dashboard_sessions_tenant"), ["tenant"], unique=False)
        batch_op.create_index(batch_op.f("ix_dashboard_sessions_expires_at"), ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_table("dashboard_sessions")
