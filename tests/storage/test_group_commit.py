"""Group commit (storage/group_commit.py): SQLite writes queued together share one transaction, every
caller returns once its own write is committed, and a failing write fails alone."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from storage.database import make_engine
from storage.group_commit import GroupCommit


def _queued_behind_the_lock(group: GroupCommit, works: list) -> list:
    """Start one thread per work while the write lock is held, release it, and collect each outcome."""
    outcomes: list = [None] * len(works)

    def call(index: int) -> None:
        try:
            outcomes[index] = ("ok", group.run(works[index]))
        except Exception as exc:  # the caller's own error
            outcomes[index] = ("error", type(exc).__name__)

    threads = [threading.Thread(target=call, args=(index,)) for index in range(len(works))]
    with group.lock:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 5
        while len(group._queue) < len(works) and time.monotonic() < deadline:
            time.sleep(0.001)
    for thread in threads:
        thread.join(10)
    return outcomes


def _insert(value: int):
    def work(connection):
        connection.execute(text("INSERT INTO t (v) VALUES (:v)"), {"v": value})
        return value
    return work


@pytest.fixture
def group(tmp_path: Path) -> GroupCommit:
    engine = make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (v INTEGER PRIMARY KEY)"))
    return GroupCommit(engine, threading.Lock())


def _committed(group: GroupCommit) -> list[int]:
    with group.engine.connect() as connection:
        return sorted(v for (v,) in connection.execute(text("SELECT v FROM t")))


def test_writes_queued_together_commit_in_one_transaction(group: GroupCommit) -> None:
    outcomes = _queued_behind_the_lock(group, [_insert(n) for n in range(6)])
    assert sorted(outcomes) == [("ok", n) for n in range(6)]
    assert _committed(group) == list(range(6))
    assert (group.groups, group.writes) == (1, 6)


def test_a_failing_write_fails_alone_and_the_others_commit(group: GroupCommit) -> None:
    def broken(connection):
        connection.execute(text("INSERT INTO t (v) VALUES (100)"))
        raise ValueError("refused")

    outcomes = _queued_behind_the_lock(group, [_insert(1), broken, _insert(2), _insert(1)])
    assert sorted(outcomes) == sorted([("ok", 1), ("error", "ValueError"), ("ok", 2), ("error", "IntegrityError")])
    assert _committed(group) == [1, 2]  # nothing of the failing writes: not the broken one's row either


def test_one_write_alone_is_an_ordinary_transaction(group: GroupCommit) -> None:
    assert group.run(_insert(7)) == 7
    assert _committed(group) == [7] and (group.groups, group.writes) == (1, 1)


def test_a_group_waits_for_another_process_holding_the_writer_lock(tmp_path: Path) -> None:
    """Processes writing to one SQLite file take turns on `<db>-writer.lock` (an flock: another open of
    the file stands in for another process here)."""
    from storage.group_commit import _held

    engine = make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (v INTEGER PRIMARY KEY)"))
    lock_file = str(tmp_path / "g.db-writer.lock")
    group = GroupCommit(engine, threading.Lock(), lock_file=lock_file)
    done = threading.Event()
    with _held(lock_file):
        writer = threading.Thread(target=lambda: (group.run(_insert(1)), done.set()))
        writer.start()
        assert not done.wait(0.3)  # waiting on the other holder
    assert done.wait(10)
    writer.join()
    assert _committed(group) == [1]


def test_stores_on_a_sqlite_file_name_the_writer_lock_beside_it(tmp_path: Path) -> None:
    from storage.store_base import _writer_lock_file

    assert _writer_lock_file(make_engine(f"sqlite:///{tmp_path / 'a.db'}")) == f"{tmp_path / 'a.db'}-writer.lock"
    assert _writer_lock_file(make_engine("sqlite://")) is None
