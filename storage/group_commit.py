"""Group commit: SQLite writes queued at the same moment share one transaction and one fsync.

SQLite has one writer, and with `synchronous=FULL` every commit waits for the disk. Under load the
gateway's worker threads queue for the write lock, each to commit a few rows of its own (a capture, an
outcome). Here the thread that gets the lock commits every write queued by then, its own included, in
one transaction, so N writes cost one fsync; each caller still returns only once its own write is
committed, so what is durable when is unchanged. A write that fails rolls the shared transaction back;
each write of that group then runs in a transaction of its own, so one bad write fails alone, with its
own error, and the others commit.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections import deque
from typing import Any, Callable, Generic, Iterator, TypeVar

from sqlalchemy import Connection, Engine

T = TypeVar("T")


class _Write(Generic[T]):
    __slots__ = ("work", "result", "error", "done")

    def __init__(self, work: Callable[[Connection], T]) -> None:
        self.work = work
        self.result: T | None = None
        self.error: BaseException | None = None
        self.done = False


class GroupCommit:
    """Runs `work(connection)` in a transaction shared with the writes queued beside it (`most` at a
    time), under `lock` (the store's write lock: other writers take turns with the group)."""

    def __init__(self, engine: Engine, lock: threading.Lock, most: int = 32, lock_file: str | None = None) -> None:
        self.engine = engine
        self.lock = lock
        # Between processes (`--workers`, several gateways on one file) SQLite's own wait is a sleep
        # that backs off (1, 2, 5, 10 ... 100 ms) and retries; a group waits on this file's lock
        # instead and starts the moment the other process's group commits. Advisory: SQLite still
        # keeps the writes apart; the kernel drops the lock of a process that dies.
        self._lock_file = lock_file
        self.most = most
        self._queue: deque[_Write[Any]] = deque()
        self._queuing = threading.Lock()
        self.groups = 0  # transactions committed (for tests and figures)
        self.writes = 0  # writes committed in them

    def run(self, work: Callable[[Connection], T]) -> T:
        write: _Write[T] = _Write(work)
        with self._queuing:
            self._queue.append(write)
        with self.lock:  # the holder commits what is queued, until its own write is done
            while not write.done:
                with self._queuing:
                    group = [self._queue.popleft() for _ in range(min(self.most, len(self._queue)))]
                self._commit(group)
        if write.error is not None:
            raise write.error
        return write.result  # type: ignore[return-value]

    def _commit(self, group: list[_Write[Any]]) -> None:
        with _held(self._lock_file):
            self._commit_held(group)

    def _commit_held(self, group: list[_Write[Any]]) -> None:
        try:
            with self.engine.begin() as connection:
                for write in group:
                    write.result = write.work(connection)
        except Exception as exc:
            if len(group) > 1:
                for write in group:  # each alone: the failing one gets its own error
                    self._commit_held([write])
                return
            group[0].error = exc
        except BaseException as exc:  # interrupted: every write of the group is told so
            for write in group:
                write.error, write.done = exc, True
            raise
        else:
            self.groups += 1
            self.writes += len(group)
        for write in group:
            write.done = True


@contextlib.contextmanager
def _held(path: str | None) -> Iterator[None]:
    """An exclusive advisory lock on the file at `path` (none without one)."""
    if path is None:
        yield
        return
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock
