"""evaluation arms, outcome signals and shadow comparisons on runs

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 23:00:00

Each run names its evaluation arm and the policy version it was evaluated under, the outcome signals
read from its request and answer, and its shadow comparison (gateway/evaluation/). The savings ledger
rolls shadow spend up on a line of its own. Older runs keep NULL: they belong to no arm.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_RUN_COLUMNS = (
    ("evaluation_arm", sa.String(length=16)), ("policy_version", sa.String(length=64)),
    ("answer_calls", sa.Integer()), ("repeated_calls", sa.Integer()), ("final_answer", sa.Boolean()),
    ("tool_results", sa.Integer()), ("tool_errors", sa.Integer()), ("rehydrations", sa.Integer()),
    ("shadow_status", sa.String(length=16)), ("shadow_same_action", sa.Boolean()),
    ("shadow_similarity", sa.Float()), ("shadow_cost_usd", sa.Float()),
)


def upgrade() -> None:
    with op.batch_alter_table("model_runs") as batch:
        for name, type_ in _RUN_COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))
    op.add_column("savings_ledger", sa.Column("evaluation_cost_usd", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("savings_ledger", "evaluation_cost_usd")
    with op.batch_alter_table("model_runs") as batch:
        for name, _ in reversed(_RUN_COLUMNS):
            batch.drop_column(name)
