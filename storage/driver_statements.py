"""The request path's statements run on the driver's own cursor, each compiled once.

SQLAlchemy's execute of a statement it has compiled before still builds an execution context, its
parameters and a result for every call, several times what SQLite takes to run a small statement.
Under SQLite's write lock (one writer: what is done under it bounds throughput) that was the largest
part of a capture's hold after the commit. Measured with bench/capture_path.py (synthetic-100), three
runs alternating with the code before this and storage/capture_rows.py together: a capture held the
write lock 0.70, 0.98, 0.87 ms against 1.21, 1.74, 1.76; a run's outcome 0.35, 0.54, 0.46 against
0.47, 0.82, 0.84. On PostgreSQL SQLAlchemy's execute was 6.6% of the gateway's samples holding the GIL
(bench/profile_path.py --postgres, synthetic-100).

A statement here is compiled by the engine's own dialect, as SQLAlchemy would compile it for the
same keys (an INSERT of rows: their keys), and sent with its parameters processed by the same bind
processors (a DateTime's text on SQLite); the typed columns it returns go through the same result
processors. It runs on the connection's driver, in the transaction SQLAlchemy began on it (on
PostgreSQL inside a pipeline too: storage/store_base.py `_batched`). A driver error goes through
SQLAlchemy's own handling: its exception for it (IntegrityError, OperationalError, ...), without the
parameters (the engine's `hide_parameters`), and a connection found lost invalidated with the pool's
others, as SQLAlchemy's execute does.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

from sqlalchemy import Connection, TextClause
from sqlalchemy.engine import Dialect


class _Slot(NamedTuple):
    name: str  # the parameter's name in the statement
    key: str  # the parameter's name as the caller gives it
    fixed: Any  # the value the statement holds itself (a literal, a constant default); _ASKED: the caller's
    process: Callable[[Any], Any] | None  # the bind processor (a DateTime's text), if any


_ASKED = object()
# The most compiled statements held: a caller that built a statement anew for every call would otherwise
# grow the cache without end (each is still run, compiled every time).
COMPILED_HELD = 512


class DriverStatement(NamedTuple):
    sql: str
    slots: tuple[_Slot, ...]  # qmark: one per `?`, in order; else one per name
    positional: bool  # the driver takes a tuple (qmark), else a mapping by name (pyformat)
    returns_rows: bool | None  # None: a text, whose rows (if any) the driver's cursor tells
    results: tuple[Callable[[Any], Any] | None, ...] | None  # result processors; None: rows as they come

    def values(self, parameters: Mapping[str, Any]) -> tuple[Any, ...] | dict[str, Any]:
        try:
            values = [
                (parameters[slot.key] if slot.fixed is _ASKED else slot.fixed) if slot.process is None
                else slot.process(parameters[slot.key] if slot.fixed is _ASKED else slot.fixed)
                for slot in self.slots]
        except KeyError as exc:
            raise ValueError(f"no value for the parameter {exc.args[0]!r} of: {self.sql}") from None
        return tuple(values) if self.positional else {slot.name: value for slot, value in zip(self.slots, values)}

    def rows(self, fetched: list[Any]) -> list[Any]:
        if self.results is None:
            return fetched
        processors = self.results
        return [tuple(value if process is None else process(value) for process, value in zip(processors, row))
                for row in fetched]


def compile_for_driver(statement: Any, dialect: Dialect, keys: Sequence[str] | None = None) -> DriverStatement:
    """`statement` as the driver runs it: `keys`, the columns an INSERT of rows is given."""
    compiled = statement.compile(dialect=dialect, column_keys=list(keys) if keys is not None else None)
    positional = dialect.paramstyle == "qmark"
    if dialect.paramstyle not in ("qmark", "pyformat") or (positional and compiled.positiontup is None):
        raise ValueError(f"the driver path takes qmark or pyformat statements, not {dialect.paramstyle}")
    if compiled.post_compile_params:  # rendered per execution by SQLAlchemy: not a fixed string
        raise ValueError("the driver path takes no expanding parameters (IN lists): use json_each on SQLite,"
                         " an array and = ANY on PostgreSQL")
    defaults = {}
    for column in (*compiled.insert_prefetch, *compiled.update_prefetch):
        default = column.default if column in compiled.insert_prefetch else column.onupdate
        if default is None or not default.is_scalar:
            raise ValueError(f"{column} has a Python default that is not a constant: use SQLAlchemy's execute")
        defaults[column.key] = default.arg
    processors = compiled._bind_processors
    slots = []
    for name in compiled.positiontup if positional else compiled.bind_names.values():
        bind = compiled.binds[name]
        if bind.key in defaults:
            fixed = defaults[bind.key]
        elif bind.callable is not None:
            raise ValueError(f"the parameter {bind.key!r} takes its value from a callable: use SQLAlchemy's execute")
        elif bind.required:
            fixed = _ASKED
        else:
            fixed = bind.effective_value
        slots.append(_Slot(name, bind.key, fixed, processors.get(name)))
    results = None
    if compiled._result_columns:
        found = tuple(column[3]._cached_result_processor(dialect, None) for column in compiled._result_columns)
        results = found if any(process is not None for process in found) else None
    returns_rows = None if isinstance(statement, TextClause) else bool(compiled._result_columns) or bool(
        getattr(compiled, "returning", None))
    return DriverStatement(compiled.string, tuple(slots), positional, returns_rows, results)


class DriverStatements:
    """The compiled statements of one engine's dialect, and how to run them on a connection's driver."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._compiled: dict[Any, DriverStatement] = {}

    def compiled(self, statement: Any, keys: Sequence[str] | None = None) -> DriverStatement:
        cache_key = (statement, tuple(keys)) if keys is not None else statement
        found = self._compiled.get(cache_key)
        if found is None:
            found = compile_for_driver(statement, self.dialect, keys)
            if len(self._compiled) < COMPILED_HELD:  # statements built once each: a few dozen in all
                self._compiled[cache_key] = found
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
        cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
        try:
            if not many:
                cursor.execute(compiled.sql, compiled.values(first))
                returns_rows = compiled.returns_rows
                if returns_rows is None:  # a text: a SELECT, or a WITH ... UPDATE without RETURNING, ...
                    returns_rows = cursor.description is not None
                return compiled.rows(cursor.fetchall()) if returns_rows else []
            if not compiled.returns_rows:  # a text's rows are not read from an executemany
                cursor.executemany(compiled.sql, [compiled.values(row) for row in parameters])  # type: ignore[union-attr]
                return []
            fetched = []
            for row in parameters:  # type: ignore[union-attr]
                cursor.execute(compiled.sql, compiled.values(row))
                fetched += cursor.fetchall()
            return compiled.rows(fetched)
        except self.dialect.loaded_dbapi.Error as exc:
            # SQLAlchemy's own handling: its exception for the driver's, without the parameters (the
            # engine's `hide_parameters`); a connection found lost is invalidated, with the pool's others
            connection._handle_dbapi_exception(exc, compiled.sql, None, cursor, None)
            raise  # not reached: the handling raises
        finally:
            cursor.close()
