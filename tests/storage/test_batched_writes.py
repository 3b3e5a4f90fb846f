"""storage/store_base.py `_batched`: on PostgreSQL the writes inside go in one round trip (psycopg's
pipeline mode), and an error the server reports for one of them is SQLAlchemy's, as an execute's would
be, so the capture's retry (IntegrityError) and its 400 for an unstorable value (DataError) still work."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import DataError, IntegrityError

from storage.records import RecordStore
from storage.schema import ConversationNode, MessageNode
from testkit.gateway import make_store

NOW = datetime(2026, 12, 4, tzinfo=timezone.utc)


@pytest.fixture
def store(storage_url: str, tmp_path: Path) -> Iterator[RecordStore]:
    store = make_store(storage_url, tmp_path / "blobs")
    yield store
    store.engine.dispose()


def _node(number: int, text: str = "hello") -> dict[str, object]:
    return {"id": f"n{number}", "tenant": "acme", "parent_id": None, "session_id": "t", "depth": 0, "role": "user",
            "message_json": f'{{"role": "user", "content": "{text}"}}', "key_id": None, "artifact_id": None,
            "first_request_id": "r", "created_at": NOW}


def _count(store: RecordStore, model: type) -> int:
    with store.engine.connect() as connection:
        return int(connection.scalar(select(func.count()).select_from(model)))


def test_the_writes_of_a_batch_land_in_order(store: RecordStore) -> None:
    with store.engine.begin() as connection, store._batched(connection):
        store._insert_ignoring_conflicts(connection, MessageNode, [_node(1), _node(2)])
        store._insert_ignoring_conflicts(connection, ConversationNode, [  # needs the nodes above: order kept
            {"conversation_id": "c", "node_id": "n1"}, {"conversation_id": "c", "node_id": "n2"}])
        store._insert_ignoring_conflicts(connection, MessageNode, [_node(2), _node(3)])  # n2 there: ignored
    assert _count(store, MessageNode) == 3 and _count(store, ConversationNode) == 2


def test_a_violation_the_server_reports_at_the_batch_end_is_sqlalchemys_and_nothing_lands(
        postgres_url: str, tmp_path: Path) -> None:
    store = make_store(postgres_url, tmp_path / "blobs")
    try:
        with pytest.raises(IntegrityError, match="foreign key") as raised:
            with store.engine.begin() as connection, store._batched(connection):
                store._insert_ignoring_conflicts(connection, MessageNode, [_node(1)])
                store._insert_ignoring_conflicts(connection, ConversationNode, [
                    {"conversation_id": "c", "node_id": "no-such-node"}])
        assert raised.value.statement is None  # raised at the batch's end, where no one statement is running
        assert _count(store, MessageNode) == 0  # the transaction rolled back with it
        with pytest.raises(DataError):  # a value PostgreSQL cannot hold, refused before it is sent
            with store.engine.begin() as connection, store._batched(connection):
                store._insert_ignoring_conflicts(connection, MessageNode, [_node(2, "nul \x00 byte")])
        with store.engine.begin() as connection, store._batched(connection):  # the pool's connection still serves
            store._insert_ignoring_conflicts(connection, MessageNode, [_node(3)])
        assert _count(store, MessageNode) == 1
    finally:
        store.engine.dispose()
