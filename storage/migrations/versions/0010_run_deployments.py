"""the deployment that answered a run, and its tries

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30 10:30:00

Several config entries may now serve one model name (deployments, with retries
and fallbacks: gateway/upstream/deployments.py). A run records which deployment answered
(or failed last) and, when there was more than one try, every try.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_runs") as batch:
        batch.add_column(sa.Column("deployment", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("attempts_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_runs") as batch:
        batch.drop_column("attempts_json")
        batch.drop_column("deployment")
