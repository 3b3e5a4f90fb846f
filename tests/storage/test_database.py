"""The engines the record store runs on (storage/database.py)."""
from __future__ import annotations

import pytest
import sqlalchemy

from storage.database import make_engine


def test_an_error_names_its_statement_but_not_what_was_bound(storage_url: str) -> None:
    """Bound values are request content: a database error (logged, or recorded on a run) leaves them out."""
    engine = make_engine(storage_url)
    try:
        with engine.connect() as connection, pytest.raises(sqlalchemy.exc.DBAPIError) as caught:
            connection.execute(sqlalchemy.text("SELECT * FROM no_such_table WHERE id = :id"), {"id": "secret-tool-output"})
    finally:
        engine.dispose()
    assert "no_such_table" in str(caught.value) and "secret-tool-output" not in str(caught.value)
