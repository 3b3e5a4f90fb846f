"""storage/store_base.py `_batched`: on PostgreSQL the writes inside go in one round trip (psycopg's
pipeline mode), and an error the server reports for one of them is SQLAlchemy's, as an execute's would
be, so the capture's retry (IntegrityError) and its 400 for an unstorable value (DataError) still work."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.exc import DataError, IntegrityError

from policies.transcript import message_path
from storage.blobs import DirectoryBlobStore
from storage.database import make_engine
from storage.record_types import RunStart
from storage.records import RecordStore
from storage.schema import Blob, ConversationNode, MessageNode
from tests.conftest import REPO
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


class _PutsSeen(DirectoryBlobStore):
    """A directory store that notes each file written (or checked) by a capture."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.puts: list[str] = []

    def put(self, data: bytes) -> str:
        key = super().put(data)
        self.puts.append(key)
        return key


def test_a_capture_writes_a_blob_file_only_once_it_holds_the_row_a_collection_has_locked(
        postgres_url: str, tmp_path: Path) -> None:
    """The blob protocol (storage/deletion.py) under the batched writes: while a collection holds a blob's
    registry row (deleted, not yet committed), a capture that needs the same file waits before writing it,
    and writes it anew once the collection has removed it: the file is there when the capture commits."""
    blobs = _PutsSeen(tmp_path / "blobs")
    store = RecordStore(make_engine(postgres_url), blobs, inline_max_bytes=1024)
    store.create_schema()
    output = "log line\n" * 1000  # over the inline limit: a blob file

    def capture(number: int) -> None:
        store.ingest(message_path("acme", [
            {"role": "user", "content": f"conversation {number}"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": output}]), RunStart(
            request_id=f"req_{number:032x}", tenant="acme", participant="p", model="fake",
            upstream_model="openai/fake", stream=False))

    try:
        capture(1)
        (key,) = set(blobs.puts)
        blobs.puts.clear()
        with store.engine.connect() as collection:
            collection.begin()
            assert collection.execute(delete(Blob).where(Blob.key == key)).rowcount == 1  # the row, locked
            second = threading.Thread(target=capture, args=(2,))
            second.start()
            time.sleep(1.0)
            assert blobs.puts == [] and second.is_alive()  # waiting for the row, the file not touched
            blobs.delete(key)
            collection.commit()
        second.join(30)
        assert blobs.puts == [key] and blobs.get(key) == output.encode()
    finally:
        store.engine.dispose()


def test_reads_queued_in_a_batch_come_back_with_it(store: RecordStore) -> None:
    """`Batch.read`: on PostgreSQL the rows of a read queued after writes come back at the batch's end
    and see those writes; a read of an array parameter gives what an execute would; on SQLite the read
    runs at once."""
    with store.engine.begin() as connection:
        with store._batched(connection) as batch:
            store._insert_ignoring_conflicts(connection, MessageNode, [_node(1), _node(2)])
            counted = batch.read(select(func.count()).select_from(MessageNode), {})
            named = batch.read(select(MessageNode.id).where(MessageNode.id == bindparam("id")), {"id": "n2"})
        assert counted.rows == [(2,)] and [tuple(r) for r in named.rows] == [("n2",)]
    if store.is_postgresql:  # an IN list is rendered per execution: refused, not sent wrong
        with store.engine.connect() as connection, pytest.raises(ValueError, match="= ANY"):
            with store._batched(connection) as batch:
                batch.read(select(MessageNode.id).where(MessageNode.id.in_(["n2", "n9"])), {})
    with store.engine.connect() as connection:
        first, second = store._read_together(connection, [
            (select(func.count()).select_from(MessageNode), {}), (select(MessageNode.id).order_by(MessageNode.id), {})])
    assert first == [(2,)] and [r[0] for r in second] == ["n1", "n2"]


def test_a_postgresql_capture_reads_in_its_two_trips(postgres_url: str, tmp_path: Path) -> None:
    """A capture on PostgreSQL sends its lock on the conversation (shared, or the touch that takes it
    exclusively) with its first look at the path's nodes, and the reads after its writes (the
    conversation's state, the new artifacts' facts) with the writes: none of those goes to the server
    on its own (through SQLAlchemy, or the store's statements on the driver), whether the conversation
    is new, active or idle."""
    from sqlalchemy import event

    from storage.capture import ACTIVE_WINDOW

    store = make_store(postgres_url, tmp_path / "blobs")
    moment = [NOW.timestamp()]
    store.clock = lambda: moment[0]
    sent: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *args: sent.append(args[2]))
    run = store._driver.run

    def seen(connection, statement, parameters=None):  # storage/driver_statements.py: past SQLAlchemy's events
        many = isinstance(parameters, list)
        if parameters or not many:
            sent.append(store._driver.compiled(statement, tuple(parameters[0]) if many else None).sql)
        return run(connection, statement, parameters)

    store._driver.run = seen
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
    try:
        for n in range(4):  # new (taken exclusively), active twice (shared), idle (taken exclusively)
            if n == 3:
                moment[0] += 2 * ACTIVE_WINDOW.total_seconds()
            messages += [{"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{n}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": f"c{n}", "content": f"out {n}"}]
            result = store.ingest(message_path("acme", messages), RunStart(
                request_id=f"req_{n}", tenant="acme", participant="p", model="fake", upstream_model="openai/fake",
                stream=False, session_label="task"))
            assert len(result.observed_at) == n + 1 and result.sibling_artifacts == 0
        statements = [" ".join(s.split()) for s in sent]
        read_alone = [s for s in statements if s.startswith(("SELECT conversations.incarnation",
                                                             "SELECT coalesce((SELECT artifact_members",
                                                             "SELECT tool_artifacts.id", "SELECT message_nodes.id"))]
        assert read_alone == []
        assert sum(1 for s in statements if s.startswith("INSERT INTO conversations ")) == 2  # the new and the idle
    finally:
        store.engine.dispose()


SQLITE_ONLY = """
import json, sys
from pathlib import Path
from gateway.upstream.encodings import use_bundled_encodings
use_bundled_encodings()
import gateway.app
from policies.transcript import message_path
from storage.record_types import RunStart
from testkit.gateway import make_store
folder = Path(sys.argv[1])
store = make_store(f"sqlite:///{folder}/gateway.db", folder / "blobs")
messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "the file"}]
run = RunStart(request_id="req_1", tenant="acme", participant="agent", model="fake", upstream_model="openai/fake",
               stream=False)
store.ingest(message_path("acme", messages), run)
print(json.dumps({"psycopg": sorted(name for name in sys.modules if name.split(".")[0] == "psycopg")}))
"""


def test_a_sqlite_gateway_never_loads_psycopg(tmp_path: Path) -> None:
    """psycopg is the PostgreSQL driver's (about 8 MB resident): a gateway on SQLite that starts its app,
    migrates its schema and captures a request (through `_batched`) leaves it unloaded. In a fresh
    interpreter: this one's other tests may have loaded it."""
    result = subprocess.run([sys.executable, "-c", SQLITE_ONLY, str(tmp_path)], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"psycopg": []}
