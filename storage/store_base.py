"""What every part of the record store shares: the engine, the blob store, the encryption keys, the clock."""
from __future__ import annotations

import contextlib
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from sqlalchemy import Connection, Engine, event
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
        # PostgreSQL over psycopg 3: the request path's transactions send BEGIN with their first
        # statements and COMMIT with their last batch (`_in_transaction(..., folded=True)`).
        self._folds = engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
        if self._folds:
            event.listen(engine, "before_cursor_execute", _begin_folded)

    def _execute(self, connection: Connection, statement: Any,
                 parameters: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None) -> list[Any]:
        """The rows `statement` returns ([] when it returns none) run on `connection` with `parameters`:
        one set, or rows to insert; on the driver's cursor (storage/driver_statements.py), as tuples.
        The first statement of a folded transaction (`_in_transaction`) goes with its BEGIN."""
        folded = connection.info.get(_FOLDED) if self._folds else None
        if folded is not None and not folded.begun:
            if isinstance(parameters, Mapping) and self._driver.compiled(statement).returns_rows:
                with self._batched(connection) as batch:  # BEGIN, the statement, its rows: one round trip
                    queued = batch.read(statement, parameters)
                return queued.rows
            folded.begin(connection.connection.driver_connection)
        return self._driver.run(connection, statement, parameters)

    def _in_transaction(self, work: Callable[[Connection], T], folded: bool = False) -> T:
        """`work(connection)` in a committed transaction: on SQLite shared with the writes queued beside
        it; on PostgreSQL its own (the server groups concurrent commits itself).

        `folded` (PostgreSQL over psycopg 3): the transaction's BEGIN goes to the server with its first
        statement and its COMMIT with its last batch (`_batched(connection, last=True)`), two round trips
        fewer than psycopg's own, which sends each alone (bench/capture_path.py counts them). psycopg
        sends BEGIN itself unless the connection is in autocommit mode, so the connection is put in it for
        the transaction (back out before it returns to the pool) and the transaction's BEGIN is a
        statement of its own: queued at the head of its first batch, or sent in one round trip with its
        first statement (`_execute`); `_begin_folded` sends it alone before any other statement. After
        the last batch committed, only reads may follow (each is then a transaction of its own)."""
        if self._group is not None:
            return self._group.run(work)
        if not (folded and self._folds):
            with self.engine.begin() as connection:
                return work(connection)
        with self.engine.connect() as connection:
            driver = connection.connection.driver_connection
            driver.autocommit = True
            connection.info[_FOLDED] = folded_state = _Folded()
            try:
                with connection.begin():  # SQLAlchemy's own (psycopg sends nothing for it): an error rolls back
                    result = work(connection)
                    if folded_state.begun and not folded_state.committed:
                        driver.execute(b"COMMIT")
            except BaseException:
                _roll_back(connection, driver)
                raise
            finally:
                connection.info.pop(_FOLDED, None)
                _leave_autocommit(connection, driver)
            return result

    def _committed(self, connection: Connection) -> bool:
        """Whether the folded transaction on `connection` committed already (with its last batch)."""
        folded = connection.info.get(_FOLDED) if self._folds else None
        return folded is not None and folded.committed

    @contextlib.contextmanager
    def _batched(self, connection: Connection, last: bool = False) -> Iterator["Batch"]:
        """On PostgreSQL, the statements executed inside go to the server together and their results
        come back in one round trip at the end (psycopg's pipeline mode): statements whose results
        nobody reads, such as inserts without RETURNING, and reads queued with the batch's `read`. An
        error the server reports for one of them is raised by a later statement of the batch or at its
        end, as SQLAlchemy's exception for it (IntegrityError, DataError, ...), the class an execute would
        have raised; the statement SQLAlchemy names with it may be a later one. Elsewhere the
        statements go one by one.

        In a folded transaction (`_in_transaction`) the first batch also carries its BEGIN, and the one
        marked `last` its COMMIT (a statement of the batch failing, the server skips the COMMIT and the
        transaction rolls back)."""
        pipeline = getattr(connection.connection.driver_connection, "pipeline", None) if self.is_postgresql else None
        if pipeline is None:  # SQLite, or a PostgreSQL driver other than psycopg 3
            yield Batch(connection, None, self._driver)
            return
        import psycopg  # the driver's own module, loaded with it: a SQLite gateway never imports it (about 8 MB)

        driver = connection.connection.driver_connection
        batch = Batch(connection, driver, self._driver)
        folded = connection.info.get(_FOLDED) if self._folds else None
        try:
            try:
                with pipeline():
                    if folded is not None and not folded.begun:
                        folded.begin(driver)  # queued: it goes with the batch
                    yield batch
                    if folded is not None and last:
                        driver.execute(b"COMMIT")
                        folded.committed = True
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


_FOLDED = "gateway.folded_transaction"  # a folded transaction's state, in its connection's `info`


class _Folded:
    """Whether a folded transaction's BEGIN and COMMIT were sent (`StoreBase._in_transaction`)."""

    __slots__ = ("begun", "committed")

    def __init__(self) -> None:
        self.begun = False
        self.committed = False

    def begin(self, driver: Any) -> None:
        """Send (or, in a pipeline, queue) the transaction's BEGIN on the psycopg connection `driver`."""
        driver.execute(b"BEGIN")
        self.begun = True


def _begin_folded(connection: Connection, cursor: Any, statement: str, parameters: Any, context: Any,
                  executemany: bool) -> None:
    """A statement SQLAlchemy executes in a folded transaction not begun yet: its BEGIN first, alone
    (in autocommit mode the statement would otherwise be a transaction of its own)."""
    folded = connection.info.get(_FOLDED)
    if folded is not None and not folded.begun:
        folded.begin(connection.connection.driver_connection)


def _roll_back(connection: Connection, driver: Any) -> None:
    """A folded transaction that failed: rolled back if the server still has it open; a connection that
    cannot say so is invalidated (the pool replaces it)."""
    try:
        driver.rollback()  # psycopg sends ROLLBACK only when the server is in a transaction
    except Exception:
        if not connection.invalidated:
            connection.invalidate()


def _leave_autocommit(connection: Connection, driver: Any) -> None:
    """The connection back out of autocommit mode before the pool has it again; one that cannot be
    (still in a transaction, or lost) is invalidated."""
    if connection.invalidated:
        return
    try:
        driver.autocommit = False
    except Exception:
        connection.invalidate()
