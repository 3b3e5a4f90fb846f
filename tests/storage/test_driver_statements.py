"""Statements on the driver's cursor (storage/driver_statements.py) store and read what SQLAlchemy's
execute stores and reads, in SQLAlchemy's transaction, and fail with SQLAlchemy's errors, on SQLite and
on PostgreSQL; a connection lost under them is invalidated as SQLAlchemy's execute invalidates it."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import Column, DateTime, Integer, MetaData, Table, bindparam, insert, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from storage.database import make_engine
from storage.driver_statements import COMPILED_HELD, DriverStatements
from storage.record_types import as_utc
from storage.run_outcomes import _FINISH_RUN
from storage.schema import Base, ModelRun

MOMENT = datetime(2026, 12, 7, 10, 30, 15, 123456, tzinfo=timezone.utc)
_RUNS = ModelRun.__table__


def _run(request_id: str, **fields: object) -> dict[str, object]:
    return {"id": request_id, "tenant": "acme", "session_id": "tree", "conversation_id": "c", "participant": "p",
            "model": "fake", "upstream_model": "openai/fake", "leaf_node_id": "leaf", "message_count": 2,
            "stream": False, "status": "pending", "started_at": MOMENT, **fields}


@pytest.fixture
def engine(storage_url: str):
    engine = make_engine(storage_url)
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def _insert(engine, table: Table):
    return (postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert)(table)


def test_rows_stored_by_the_driver_read_as_sqlalchemy_stores_them(engine) -> None:
    driver = DriverStatements(engine.dialect)
    outcome = {"request_id": "", "status": "ok", "latency_ms": 12, "http_status": 200, "error_type": None,
               "error_message": None, "prompt_tokens": 5, "completion_tokens": 1, "cached_tokens": None,
               "total_tokens": 6, "cost_usd": 0.25, "cost_original_usd": None, "tokens_original": 9,
               "tokens_forwarded": 7, "cache_write_tokens": None, "finish_reason": "stop", "response_json": "{}",
               "key_id": None, "finished_at": MOMENT, "deployment": None, "upstream_model": None,
               "attempts_json": None, "answer_calls": 0, "repeated_calls": 0, "final_answer": True,
               "tool_results": 1, "tool_errors": 0, "rehydrations": 0}
    with engine.begin() as connection:
        connection.execute(insert(_RUNS), [_run("by-sqlalchemy")])
        assert driver.run(connection, insert(_RUNS), [_run("by-driver")]) == []
        through_sqlalchemy = connection.execute(_FINISH_RUN, {**outcome, "request_id": "by-sqlalchemy"}).all()
        through_driver = driver.run(connection, _FINISH_RUN, {**outcome, "request_id": "by-driver"})
    assert through_driver == [tuple(row) for row in through_sqlalchemy] == [("acme", "c", "leaf")]
    with engine.connect() as connection:
        rows = {row.id: row._asdict() for row in connection.execute(select(_RUNS))}
    assert rows["by-driver"] | {"id": "by-sqlalchemy"} == rows["by-sqlalchemy"]
    assert as_utc(rows["by-driver"]["finished_at"]) == MOMENT  # on SQLite SQLAlchemy's text, read back
    assert rows["by-driver"]["final_answer"] is True and rows["by-driver"]["upstream_model"] == "openai/fake"
    with engine.begin() as connection:  # a finished run is not finished again: no row comes back
        assert driver.run(connection, _FINISH_RUN, {**outcome, "request_id": "by-driver"}) == []


def test_typed_columns_read_through_sqlalchemys_processors(engine) -> None:
    driver = DriverStatements(engine.dialect)
    statement = select(_RUNS.c.id, _RUNS.c.started_at, _RUNS.c.stream).where(_RUNS.c.tenant == bindparam("tenant"))
    with engine.begin() as connection:
        connection.execute(insert(_RUNS), [_run("r1"), _run("r2", stream=True)])
        assert sorted(driver.run(connection, statement, {"tenant": "acme"})) == sorted(
            tuple(row) for row in connection.execute(statement, {"tenant": "acme"}))
        assert as_utc(driver.run(connection, statement, {"tenant": "acme"})[0][1]) == MOMENT


def test_rows_inserted_with_returning_come_back_each(engine) -> None:
    table = Table("numbers", MetaData(), Column("n", Integer, primary_key=True), Column("at", DateTime))
    table.create(engine)
    driver = DriverStatements(engine.dialect)
    statement = _insert(engine, table).on_conflict_do_nothing().returning(table.c.n, table.c.at)
    with engine.begin() as connection:
        made = driver.run(connection, statement, [{"n": 1, "at": MOMENT}, {"n": 2, "at": MOMENT}])
        assert [(n, as_utc(at)) for n, at in made] == [(1, MOMENT), (2, MOMENT)]
        assert driver.run(connection, statement, [{"n": 2, "at": MOMENT}, {"n": 3, "at": None}]) == [(3, None)]


def test_the_driver_writes_in_sqlalchemys_transaction(engine) -> None:
    driver = DriverStatements(engine.dialect)
    with pytest.raises(RuntimeError), engine.begin() as connection:
        driver.run(connection, insert(_RUNS), [_run("rolled-back")])
        raise RuntimeError("the transaction fails after the write")
    with engine.begin() as connection:
        driver.run(connection, insert(_RUNS), [_run("kept")])
    with engine.connect() as connection:
        assert list(connection.scalars(select(_RUNS.c.id))) == ["kept"]


def test_a_driver_error_is_sqlalchemys_without_the_parameters(engine) -> None:
    driver = DriverStatements(engine.dialect)
    secret = "the tool output nobody may log"
    with engine.begin() as connection:
        driver.run(connection, insert(_RUNS), [_run("once", session_label=secret)])
        with pytest.raises(IntegrityError) as raised:
            driver.run(connection, insert(_RUNS), [_run("once", session_label=secret)])
    assert "model_runs" in str(raised.value) and secret not in str(raised.value)
    gone = Table("gone", MetaData(), Column("id", Integer))  # a table the database does not have
    with engine.begin() as connection, pytest.raises(DBAPIError, match="no such table: gone|\"gone\" does not exist"):
        driver.run(connection, select(gone.c.id), {})


def test_what_the_driver_path_cannot_run_is_refused_by_name(engine) -> None:
    driver = DriverStatements(engine.dialect)
    with engine.begin() as connection:
        with pytest.raises(ValueError, match="'tenant'"):  # a parameter not given: named, never bound as NULL
            driver.run(connection, select(_RUNS.c.id).where(_RUNS.c.tenant == bindparam("tenant")), {})
        with pytest.raises(ValueError, match="expanding"):
            driver.run(connection, select(_RUNS.c.id).where(_RUNS.c.status.in_(["ok", "error"])), {})
    table = Table("stamped", MetaData(), Column("n", Integer, primary_key=True),
                  Column("at", DateTime, default=lambda: MOMENT))
    with pytest.raises(ValueError, match="not a constant"):
        driver.compiled(insert(table), ["n"])


def test_a_connection_lost_under_the_driver_is_invalidated_with_the_pool(postgres_url: str) -> None:
    engine = make_engine(postgres_url, ping_after_idle=3600.0)  # no ping: the statement meets the loss
    Base.metadata.create_all(engine)
    driver = DriverStatements(engine.dialect)
    backend = text("SELECT pg_backend_pid()")
    statement = select(_RUNS.c.id).where(_RUNS.c.id == bindparam("id"))
    try:
        with engine.connect() as first, engine.connect() as second:  # two in the pool
            lost = {first.scalar(backend), second.scalar(backend)}
        admin = make_engine(postgres_url)
        with admin.connect() as connection:  # the server closes both while they sit in the pool
            assert all(connection.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}) for pid in lost)
        admin.dispose()
        with engine.connect() as connection, pytest.raises(OperationalError) as raised:
            driver.run(connection, statement, {"id": "x"})
        assert raised.value.connection_invalidated
        with engine.connect() as connection:  # the pool's other lost connection went too: connected anew
            assert driver.run(connection, statement, {"id": "x"}) == [] and connection.scalar(backend) not in lost
    finally:
        engine.dispose()


def test_statements_built_anew_each_call_run_without_growing_the_cache(engine) -> None:
    driver = DriverStatements(engine.dialect)
    with engine.begin() as connection:
        for n in range(COMPILED_HELD + 20):  # a caller that builds its statement every time
            assert driver.run(connection, select(_RUNS.c.id).where(_RUNS.c.id == bindparam(f"id_{n}")),
                              {f"id_{n}": "none"}) == []
    assert len(driver._compiled) == COMPILED_HELD


def test_a_text_returns_the_rows_its_driver_says_it_has(engine) -> None:
    """A textual statement is read when the driver has rows for it: a SELECT, a CTE that selects, and
    not a CTE that only writes (fetching rows it has none of would fail)."""
    driver = DriverStatements(engine.dialect)
    with engine.begin() as connection:
        driver.run(connection, insert(_RUNS), [_run("r1")])
        assert driver.run(connection, text("SELECT id FROM model_runs WHERE id = :id"), {"id": "r1"}) == [("r1",)]
        assert driver.run(connection, text("WITH found AS (SELECT id FROM model_runs WHERE id = :id)"
                                           " SELECT count(*) FROM found"), {"id": "r1"}) == [(1,)]
        assert driver.run(connection, text("WITH found AS (SELECT id FROM model_runs WHERE id = :id)"
                                           " UPDATE model_runs SET status = 'ok' WHERE id IN (SELECT id FROM found)"),
                          {"id": "r1"}) == []
        assert driver.run(connection, text("SELECT status FROM model_runs WHERE id = :id"), {"id": "r1"}) == [("ok",)]
