"""What every part of the record store shares: the engine, the blob store, the encryption keys, the clock."""
from __future__ import annotations

import contextlib
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError

from storage.blobs import BlobStore
from storage.driver_statements import DriverStatements
from storage.encryption import NO_ENCRYPTION, EncryptionKeys
from storage.group_commit import GroupCommit
from storage.schema import Base
from storage.sealed_blobs import SealedBlobs

DEFAULT_INLINE_MAX_BYTES = 64 * 1024
T = TypeVar("T")


class StoreBase:
    def __init__(
        self,
        engine: Engine,
        blobs: BlobStore,
        *,
        inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES,
        encryption: EncryptionKeys = NO_ENCRYPTION,
        clock: Callable[[], float] = time.time,
        instance_id: str | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.blobs = blobs
        self.encryption = encryption  # encryption at rest of captured content (storage/encryption.py)
        self.sealed_blobs = SealedBlobs(blobs, encryption)  # what capture and reads go through
        self.inline_max_bytes = inline_max_bytes
        self.instance_id = instance_id  # set by register_instance when a gateway serves
        self._insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
        self._ignoring_conflicts: dict[Any, Any] = {}  # built once per table (and RETURNING column)
        # the request path's statements go to the driver itself (storage/driver_statements.py)
        self._driver = DriverStatements(engine.dialect)
        # SQLite has one writer at a time, and a connection that finds the file locked sleeps in
        # SQLite's busy handler (1 ms, then 2, 5, ... up to 100 ms a try). The threads of one
        # process take turns here instead, handing over the moment a write commits; other
        # processes (--workers, replicas) still meet the busy handler.
        self._writing = threading.Lock() if engine.dialect.name == "sqlite" else contextlib.nullcontext()
        # SQLite: the captures and outcomes queued together commit together (storage/group_commit.py).
        self._group = GroupCommit(engine, self._writing, lock_file=_writer_lock_file(engine)) \
            if engine.dialect.name == "sqlite" else None

    def _execute(self, connection: Connection, statement: Any,
                 parameters: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None) -> list[Any]:
        """The rows `statement` returns ([] when it returns none) run on `connection` with `parameters`:
        one set, or rows to insert; on the driver's cursor (storage/driver_statements.py), as tuples."""
        return self._driver.run(connection, statement, parameters)

    def _in_transaction(self, work: Callable[[Connection], T]) -> T:
        """`work(connection)` in a committed transaction: on SQLite shared with the writes queued beside
        it; on PostgreSQL its own (the server groups concurrent commits itself)."""
        if self._group is not None:
            return self._group.run(work)
        with self.engine.begin() as connection:
            return work(connection)

    @contextlib.contextmanager
    def _batched(self, connection: Connection) -> Iterator["Batch"]:
        """On PostgreSQL, the statements executed inside go to the server together and their results
        come back in one round trip at the end (psycopg's pipeline mode): statements whose results
        nobody reads, such as inserts without RETURNING, and reads queued with the batch's `read`. An
        error the server reports for one of them is raised by a later statement of the batch or at its
        end, as SQLAlchemy's exception for it (IntegrityError, DataError, ...), the class an execute would
        have raised; the statement SQLAlchemy names with it may be a later one. Elsewhere the
        statements go one by one."""
        pipeline = getattr(connection.connection.driver_connection, "pipeline", None) if self.is_postgresql else None
        if pipeline is None:  # SQLite, or a PostgreSQL driver other than psycopg 3
            yield Batch(connection, None, self._driver)
            return
        import psycopg  # the driver's own module, loaded with it: a SQLite gateway never imports it (about 8 MB)

        batch = Batch(connection, connection.connection.driver_connection, self._driver)
        try:
            try:
                with pipeline():
                    yield batch
            except psycopg.Error as exc:  # the pipeline's sync: outside SQLAlchemy's execute and its wrapping
                raise DBAPIError.instance(None, None, exc, psycopg.Error) from exc
            batch.fetch()
        finally:
            batch.close()

    def _read_together(self, connection: Connection,
                       reads: Sequence[tuple[Any, Mapping[str, Any]]]) -> list[list[Any]]:
        """The rows of each of `reads` (a statement and its parameters), in one round trip on PostgreSQL
        (`_batched`). The server still runs them one after another, each seeing what those before it did
        (a lock one takes holds for those after it)."""
        with self._batched(connection) as batch:
            queued = [batch.read(statement, parameters) for statement, parameters in reads]
        return [read.rows for read in queued]

    @property
    def is_postgresql(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), timezone.utc)

    def _insert_ignoring_conflicts(self, connection: Connection, model: type[Base],
                                   rows: list[dict[str, Any]], returning: str | None = None) -> list[Any]:
        """Insert the rows that are not there yet; with `returning` (a column's name), that column of
        each row it made (in no particular order), else []."""
        if not rows:
            return []
        statement = self._ignoring_conflicts.get((model, returning))
        if statement is None:
            statement = self._insert(model.__table__).on_conflict_do_nothing()
            if returning is not None:
                statement = statement.returning(model.__table__.c[returning])
            self._ignoring_conflicts[(model, returning)] = statement
        if returning is None:
            self._execute(connection, statement, rows)
            return []
        return [row[0] for row in self._execute(connection, statement, rows)]


class Queued:
    """The rows of a read queued in a batch: there once the batch is over."""

    rows: list[Any]


class Batch:
    """What `StoreBase._batched` yields: reads queued in it (`read`) come back with the batch's other
    results. On PostgreSQL on cursors of their own, fetched at the batch's end (`statements` compiles
    them once); elsewhere (`driver` None) run at once."""

    def __init__(self, connection: Connection, driver: Any, statements: DriverStatements) -> None:
        self._connection = connection
        self._driver = driver
        self._statements = statements
        self._pending: list[tuple[Queued, Any]] = []

    def read(self, statement: Any, parameters: Mapping[str, Any]) -> Queued:
        queued = Queued()
        if self._driver is None:
            queued.rows = self._statements.run(self._connection, statement, parameters)
            return queued
        compiled = self._statements.compiled(statement)
        cursor = self._driver.cursor()
        self._pending.append((queued, cursor))
        cursor.execute(compiled.sql, compiled.values(parameters))
        return queued

    def fetch(self) -> None:
        for queued, cursor in self._pending:
            queued.rows = cursor.fetchall()

    def close(self) -> None:
        for _, cursor in self._pending:
            cursor.close()


def _writer_lock_file(engine: Engine) -> str | None:
    """`<database>-writer.lock` beside a SQLite file (None in memory): the processes writing to one
    file take turns on it (storage/group_commit.py)."""
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return f"{database}-writer.lock"
