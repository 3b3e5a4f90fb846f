"""Engines for the record store: SQLite (embedded default) or PostgreSQL."""
from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    """An engine for `url`; SQLite is set up for durable, concurrent writes.

    A PostgreSQL URL may name a schema with `?options=-csearch_path%3DNAME`
    (psycopg passes it to the server), which is how tests get one each.
    """
    parsed = make_url(url)
    # A statement's parameters are request content (transcripts, tool results): an error's text names
    # the statement but not what was bound to it, so neither a log line nor a run record carries them.
    kwargs: dict[str, Any] = {"future": True, "hide_parameters": True}
    if parsed.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        engine = create_engine(url, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")  # a committed artifact survives power loss
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    if parsed.get_backend_name() == "postgresql":
        kwargs.update(pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)
        return create_engine(url, **kwargs)
    raise ValueError(f"unsupported storage url {parsed.render_as_string(hide_password=True)!r}: use sqlite:/// or postgresql+psycopg://")


_SECRET_PARAMETERS = frozenset({"password", "sslpassword"})  # libpq's, also accepted in the query string


def safe_url(url: str) -> str:
    """`url` without its password, in the user part or the query string."""
    try:
        parsed = make_url(url)
    except sa_exc.ArgumentError:
        return url.rsplit("@", 1)[-1]  # not a URL SQLAlchemy reads: nothing of what comes before an '@'
    hidden = {name: "***" for name in parsed.query if name.lower() in _SECRET_PARAMETERS}
    return (parsed.update_query_dict(hidden) if hidden else parsed).render_as_string(hide_password=True)


def unavailable(exc: BaseException) -> str | None:
    """Why the database cannot be used, in one line, when `exc` (or its cause) says it is away: a
    connection refused or lost, a file that cannot be opened, a lock not released in time, no free
    connection in the pool. None for any other error."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (sa_exc.OperationalError, sa_exc.InterfaceError)):
            text = str(seen.orig or seen).strip()
            return text.splitlines()[0] if text else type(seen.orig or seen).__name__
        if isinstance(seen, sa_exc.TimeoutError):
            return "no free connection in the pool"
        seen = seen.__cause__
    return None
