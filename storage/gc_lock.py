"""One garbage collection at a time across every process sharing a database.

PostgreSQL: a session advisory lock, held on a connection of its own for the
whole run (a process that dies releases it with its connection). SQLite: an
exclusive `flock` on a file beside the database, which every process (and
thread) opening the same database contends for. The lock lives where the
data does, so replicas need nothing else (no Redis) to agree.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from typing import Iterator

from sqlalchemy import Engine, text

GC_LOCK = 0x6763_6C6B  # "gclk": the advisory lock id garbage collection holds on PostgreSQL
_MEMORY_LOCKS: dict[int, threading.Lock] = {}
_MEMORY_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def exclusive(engine: Engine) -> Iterator[bool]:
    """Yields True while this caller holds the collection lock, False (at once) if another does."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            acquired = bool(connection.scalar(text("SELECT pg_try_advisory_lock(:key)"), {"key": GC_LOCK}))
            connection.commit()
            try:
                yield acquired
            finally:
                if acquired:
                    connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": GC_LOCK})
                    connection.commit()
        return
    database = engine.url.database
    if not database or database == ":memory:":  # one process owns the database: a lock per engine
        with _MEMORY_LOCKS_GUARD:
            lock = _MEMORY_LOCKS.setdefault(id(engine), threading.Lock())
        acquired = lock.acquire(blocking=False)
        try:
            yield acquired
        finally:
            if acquired:
                lock.release()
        return
    fd = os.open(f"{database}.gc-lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
