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
