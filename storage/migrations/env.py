"""Alembic environment: runs on the connection the record store hands it."""
from __future__ import annotations

from alembic import context

from storage.schema import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True,
                  compare_type=True)
with context.begin_transaction():
    context.run_migrations()
