"""The Alembic migrations build exactly the schema the models describe, on SQLite and PostgreSQL."""
from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from storage.schema import Base
from tests.conftest import make_store


def test_migrations_match_the_models(storage_url: str, tmp_path: Path) -> None:
    store = make_store(storage_url, tmp_path / "blobs")
    try:
        with store.engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
            tables = set(inspect(connection).get_table_names())
        assert diff == []
        assert {"message_nodes", "model_runs", "tool_calls", "tool_artifacts", "context_assemblies",
                "alembic_version"} <= tables
        store.create_schema()  # a second start is a no-op
    finally:
        store.engine.dispose()
