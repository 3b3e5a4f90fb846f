"""The engines the record store runs on (storage/database.py)."""
from __future__ import annotations

import pytest
import sqlalchemy

from storage.database import make_engine, safe_url


def test_an_error_names_its_statement_but_not_what_was_bound(storage_url: str) -> None:
    """Bound values are request content: a database error (logged, or recorded on a run) leaves them out."""
    engine = make_engine(storage_url)
    try:
        with engine.connect() as connection, pytest.raises(sqlalchemy.exc.DBAPIError) as caught:
            connection.execute(sqlalchemy.text("SELECT * FROM no_such_table WHERE id = :id"), {"id": "secret-tool-output"})
    finally:
        engine.dispose()
    assert "no_such_table" in str(caught.value) and "secret-tool-output" not in str(caught.value)


def test_safe_url_hides_the_password_in_the_user_part_and_the_query() -> None:
    assert safe_url("postgresql+psycopg://app:s3cret@db:5432/gw") == "postgresql+psycopg://app:***@db:5432/gw"
    hidden = safe_url("postgresql+psycopg://app@db/gw?sslmode=require&password=s3cret&sslpassword=k3y")
    assert "s3cret" not in hidden and "k3y" not in hidden and "sslmode=require" in hidden
    assert safe_url("sqlite:////var/lib/gateway.db") == "sqlite:////var/lib/gateway.db"
    assert "s3cret" not in safe_url("not a url://app:s3cret@db")  # one SQLAlchemy cannot read


def _backend(connection: sqlalchemy.Connection) -> int:
    return int(connection.scalar(sqlalchemy.text("SELECT pg_backend_pid()")))


def _terminate(postgres_url: str, pid: int) -> None:
    admin = make_engine(postgres_url)
    try:
        with admin.connect() as connection:
            assert connection.scalar(sqlalchemy.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    finally:
        admin.dispose()


def _counting_pings(engine: sqlalchemy.Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    pings: list[int] = []
    ping = engine.dialect.do_ping

    def counted(dbapi_connection):  # the real ping, counted
        pings.append(1)
        return ping(dbapi_connection)

    monkeypatch.setattr(engine.dialect, "do_ping", counted)
    return pings


def test_a_connection_back_a_moment_ago_is_not_pinged(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(postgres_url, ping_after_idle=60.0)
    pings = _counting_pings(engine, monkeypatch)
    try:
        with engine.connect() as connection:
            first = _backend(connection)
        for _ in range(5):
            with engine.begin() as connection:
                assert _backend(connection) == first  # the same pooled connection, used at once
        assert pings == []
    finally:
        engine.dispose()


def test_a_connection_idle_too_long_is_pinged_and_replaced_when_dead(postgres_url: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(postgres_url, ping_after_idle=0.0)  # every connection back counts as idle
    pings = _counting_pings(engine, monkeypatch)
    try:
        with engine.connect() as connection:
            first = _backend(connection)
        with engine.connect() as connection:
            assert _backend(connection) == first and pings == [1]  # alive: kept
        _terminate(postgres_url, first)  # the server closes it while it sits in the pool
        with engine.connect() as connection:
            assert _backend(connection) != first  # pinged, found dead, connected again: no error
        assert len(pings) == 2
    finally:
        engine.dispose()


def test_a_connection_that_died_unpinged_fails_once_then_the_pool_is_new(postgres_url: str) -> None:
    """What a server restart costs without the ping: the statement on the dead connection fails as a
    disconnect (the gateway answers 503 without a record), and the pool is replaced, so the next
    checkout works."""
    engine = make_engine(postgres_url, ping_after_idle=60.0)
    try:
        with engine.connect() as connection:
            first = _backend(connection)
        _terminate(postgres_url, first)
        with pytest.raises(sqlalchemy.exc.OperationalError) as failed:
            with engine.connect() as connection:
                _backend(connection)
        assert failed.value.connection_invalidated
        with engine.connect() as connection:
            assert _backend(connection) != first
    finally:
        engine.dispose()
