"""SQLite: the request path's statements run on the driver's own cursor, each compiled once.

SQLAlchemy's execute of a statement it has compiled before still builds an execution context, its
parameters and a result for every call. Measured in process (bench/capture_path.py's replay with
`Connection.execute` timed, synthetic-100): of a capture's 1.74 ms under SQLite's write lock, 0.64
went to its seven executes, 0.19 of it SQLite's own; a run's outcome spent 0.36 ms in executes, 0.09
SQLite's. Under the write lock (one writer: what is done under it bounds throughput) that is the
largest part of a request's hold after the commit itself.

A statement here is compiled by the engine's own dialect, as SQLAlchemy would compile it for the
same keys (an INSERT of rows: their keys), and sent with its parameters processed by the same bind
processors (a DateTime's text); the typed columns it returns go through the same result processors.
It runs on the connection's driver, in the transaction SQLAlchemy began on it. A driver error is
raised as SQLAlchemy's exception for it (IntegrityError, OperationalError, ...), without the
parameters, as the engine raises it (`hide_parameters`). PostgreSQL keeps SQLAlchemy's execute (its
cost there is the round trip; storage/store_base.py `_batched` sends several in one).
"""
from __future__ import annotations

import sqlite3
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError


class _Slot(NamedTuple):
    key: str  # the parameter's name as the caller gives it
    fixed: Any  # the value the statement holds itself (a literal, a constant default); _ASKED: the caller's
    process: Callable[[Any], Any] | None  # the bind processor (a DateTime's text), if any


_ASKED = object()


class DriverStatement(NamedTuple):
    sql: str
    slots: tuple[_Slot, ...]  # one per `?`, in order
    returns_rows: bool
    results: tuple[Callable[[Any], Any] | None, ...] | None  # result processors; None: rows as they come

    def values(self, parameters: Mapping[str, Any]) -> tuple[Any, ...]:
        try:
            return tuple(
                (parameters[slot.key] if slot.fixed is _ASKED else slot.fixed) if slot.process is None
                else slot.process(parameters[slot.key] if slot.fixed is _ASKED else slot.fixed)
                for slot in self.slots)
        except KeyError as exc:
            raise ValueError(f"no value for the parameter {exc.args[0]!r} of: {self.sql}") from None

    def rows(self, fetched: list[Any]) -> list[Any]:
        if self.results is None:
            return fetched
        processors = self.results
        return [tuple(value if process is None else process(value) for process, value in zip(processors, row))
                for row in fetched]


def compile_for_driver(statement: Any, dialect: Dialect, keys: Sequence[str] | None = None) -> DriverStatement:
    """`statement` as the driver runs it: `keys`, the columns an INSERT of rows is given."""
    compiled = statement.compile(dialect=dialect, column_keys=list(keys) if keys is not None else None)
    if dialect.paramstyle != "qmark" or compiled.positiontup is None:
        raise ValueError(f"the driver path takes qmark statements, not {dialect.paramstyle}")
    if compiled.post_compile_params:  # rendered per execution by SQLAlchemy: not a fixed string
        raise ValueError("the driver path takes no expanding parameters (IN lists): use json_each")
    defaults = {}
    for column in (*compiled.insert_prefetch, *compiled.update_prefetch):
        default = column.default if column in compiled.insert_prefetch else column.onupdate
        if default is None or not default.is_scalar:
            raise ValueError(f"{column} has a Python default that is not a constant: use SQLAlchemy's execute")
        defaults[column.key] = default.arg
    processors = compiled._bind_processors
    slots = []
    for name in compiled.positiontup:
        bind = compiled.binds[name]
        if bind.key in defaults:
            fixed = defaults[bind.key]
        elif bind.callable is not None:
            raise ValueError(f"the parameter {bind.key!r} takes its value from a callable: use SQLAlchemy's execute")
        elif bind.required:
            fixed = _ASKED
        else:
            fixed = bind.effective_value
        slots.append(_Slot(bind.key, fixed, processors.get(name)))
    results = None
    if compiled._result_columns:
        found = tuple(column[3]._cached_result_processor(dialect, None) for column in compiled._result_columns)
        results = found if any(process is not None for process in found) else None
    returns_rows = bool(compiled._result_columns) or bool(getattr(statement, "_returning", ())) or bool(
        getattr(compiled, "returning", None)) or _is_text_select(statement)
    return DriverStatement(compiled.string, tuple(slots), returns_rows, results)


def _is_text_select(statement: Any) -> bool:
    """A textual statement (`text(...)`) that reads: its rows are the caller's."""
    sql = getattr(statement, "text", None)
    return isinstance(sql, str) and sql.lstrip().upper().startswith(("SELECT", "WITH"))


class DriverStatements:
    """The compiled statements of one engine's dialect, and how to run them on a connection's driver."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._compiled: dict[Any, DriverStatement] = {}

    def compiled(self, statement: Any, keys: Sequence[str] | None = None) -> DriverStatement:
        cache_key = (statement, tuple(keys)) if keys is not None else statement
        found = self._compiled.get(cache_key)
        if found is None:
            found = self._compiled[cache_key] = compile_for_driver(statement, self.dialect, keys)
        return found

    def run(self, connection: Connection, statement: Any,
            parameters: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None) -> list[Any]:
        """The rows `statement` returns (none: []) for `parameters`: one set, or a list of rows to
        insert, all with the same keys (one executemany; one execute each when it returns rows)."""
        many = isinstance(parameters, (list, tuple))
        if many and not parameters:
            return []
        first = parameters[0] if many else (parameters or {})  # type: ignore[index]
        compiled = self.compiled(statement, tuple(first) if many else None)
        driver = connection.connection.driver_connection
        try:
            if not many:
                cursor = driver.execute(compiled.sql, compiled.values(first))  # type: ignore[union-attr]
                return compiled.rows(cursor.fetchall()) if compiled.returns_rows else []
            if not compiled.returns_rows:
                driver.executemany(compiled.sql, [compiled.values(row) for row in parameters])  # type: ignore[union-attr]
                return []
            fetched = []
            for row in parameters:  # type: ignore[union-attr]
                fetched += driver.execute(compiled.sql, compiled.values(row)).fetchall()  # type: ignore[union-attr]
            return compiled.rows(fetched)
        except sqlite3.Error as exc:
            raise DBAPIError.instance(compiled.sql, None, exc, sqlite3.Error, hide_parameters=True,
                                      dialect=self.dialect) from exc
