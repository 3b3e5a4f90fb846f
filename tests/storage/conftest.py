"""The record store most storage tests use: fresh, on SQLite and on PostgreSQL (a module may define its own)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from storage.records import RecordStore
from testkit.gateway import make_store


@pytest.fixture
def store(storage_url: str, tmp_path: Path) -> Iterator[RecordStore]:
    store = make_store(storage_url, tmp_path / "blobs")
    yield store
    store.engine.dispose()
