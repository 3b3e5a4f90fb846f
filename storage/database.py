"""Engines for the record store: SQLite (embedded default) or PostgreSQL."""
from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url


# A pooled PostgreSQL connection idle for longer than this is pinged before it is used again.
PING_AFTER_IDLE_SECONDS = 1.0


def make_engine(url: str, *, pool_size: int = 10, ping_after_idle: float = PING_AFTER_IDLE_SECONDS) -> Engine:
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
        kwargs.update(pool_size=pool_size, max_overflow=pool_size)
        engine = create_engine(url, **kwargs)
        _ping_when_idle(engine, ping_after_idle)
        return engine
    raise ValueError(f"unsupported storage url {parsed.render_as_string(hide_password=True)!r}: use sqlite:/// or postgresql+psycopg://")


def _ping_when_idle(engine: Engine, after: float) -> None:
    """Ping a pooled connection before it is used again only when it sat in the pool for longer than
    `after` seconds; a dead one is replaced (the pool connects again, up to three times).

    SQLAlchemy's `pool_pre_ping` pings at every checkout: a round trip (two with psycopg, whose first
    statement begins the transaction with a BEGIN of its own) for each of a request's transactions.
    Measured with bench/proxy_compare.py on PostgreSQL (coding-agent, synthetic-100, one worker, 2 CPUs):
    10.69 against 12.79 ms added and 106.5 against 93.3 requests/s at 20 clients without it. A
    connection back from a request a moment ago is almost always alive; one that died meanwhile (the
    server restarted) fails its statement, SQLAlchemy sees the disconnect and replaces every pooled
    connection, and the request answers 503 `storage_unavailable` without a record, as any request the
    restart cut off does. One that sat idle (the server may have closed it, or restarted long ago)
    is still pinged first."""

    @event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since <= after:
            return  # just connected, or back a moment ago
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # any failure of the ping: the pool connects again
            raise sa_exc.DisconnectionError(f"a pooled connection idle for {after:g} s did not answer") from exc


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
