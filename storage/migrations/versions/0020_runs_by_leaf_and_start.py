"""model_runs: one index on (leaf_node_id, started_at) in place of the one on leaf_node_id

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03 16:00:00

Every request asks for the latest run that ended at one of its path's last leaves (its previous
run) and, for each new assistant message, the latest run that ended at its parent (the run that
produced it). Through an index on the leaf alone, both read and sorted every run that ever ended
there: a prefix sent again and again (retries, an agent branching from one point, a benchmark)
made each request slower than the last. With the start in the index, each leaf's latest run is
one probe from the index's end (storage/path_reads.py), however many runs ended there.
"""
from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_runs", schema=None) as batch_op:
        batch_op.create_index("ix_model_runs_leaf_started", ["leaf_node_id", "started_at"], unique=False)
        batch_op.drop_index("ix_model_runs_leaf_node_id")


def downgrade() -> None:
    with op.batch_alter_table("model_runs", schema=None) as batch_op:
        batch_op.create_index("ix_model_runs_leaf_node_id", ["leaf_node_id"], unique=False)
        batch_op.drop_index("ix_model_runs_leaf_started")
