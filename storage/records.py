"""The record store: one object over one SQLAlchemy engine and one blob store.

Its parts live in their own modules: capture (`storage/capture.py`, with what it reads
about a path in `storage/path_reads.py` and a run's outcome in `storage/run_outcomes.py`), the read
side (`storage/reads.py`), deletion and blob collection
(`storage/deletion.py`), retention and garbage collection (`storage/retention.py`), tenant
purge (`storage/purge.py`), serving instances and the runs a dead one left
pending (`storage/instances.py`), keys made through the API (`storage/api_keys.py`), dashboard sessions
(`storage/dashboard_sessions.py`), key rotation (`storage/rotation.py`), remote compactions
(`storage/compactions.py`).
"""
from __future__ import annotations

from pathlib import Path

from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig
from sqlalchemy import text

from storage.api_keys import KeyRecords
from storage.capture import Capture
from storage.compactions import Compactions
from storage.dashboard_sessions import DashboardSessions
from storage.evaluations import Evaluations
from storage.instances import Instances
from storage.purge import Purge
from storage.reads import Reads
from storage.rotation import Rotation
from storage.retention import Retention

_MIGRATION_LOCK = 0x6761_7465  # "gate": the advisory lock id migrations hold on PostgreSQL


class RecordStore(Capture, Reads, Retention, Purge, Instances, KeyRecords, DashboardSessions, Rotation, Evaluations,
                  Compactions):
    def create_schema(self) -> None:
        """Bring the database to the latest schema (Alembic migrations in storage/migrations).

        On PostgreSQL an advisory lock serialises replicas that start together.
        """
        config = AlembicConfig()
        config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
        with self.engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            config.attributes["connection"] = connection
            alembic_command.upgrade(config, "head")

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
