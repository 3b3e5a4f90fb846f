"""bench/statement_times.py's clock: every statement an engine sends while it is on, timed and grouped
by its first words, the slowest of each kind kept with its parameters; nothing while it is off."""
from __future__ import annotations

import sys
from pathlib import Path

from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from statement_times import StatementClock, kind_of  # noqa: E402


def test_statements_are_grouped_by_their_first_words() -> None:
    assert kind_of("SELECT  a.id,\n b FROM t WHERE x = 1") == "SELECT a.id, b FROM"
    assert kind_of("INSERT INTO t (a) VALUES (?)") == "INSERT INTO t (a)"


def test_the_clock_times_what_runs_while_it_is_on(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    clock = StatementClock(engine)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"))
        clock.on = True
        connection.execute(text("INSERT INTO t (id, v) VALUES (:id, :v)"), [{"id": n, "v": "x"} for n in range(5)])
        for n in range(3):
            connection.execute(text("SELECT v FROM t WHERE id = :id"), {"id": n})
        clock.on = False
        connection.execute(text("SELECT count(*) FROM t"))
    assert clock.counts == {"INSERT INTO t (id,": 1, "SELECT v FROM t": 3}
    assert all(seconds > 0 for seconds in clock.seconds.values())
    took, statement, parameters, many = clock.slowest["SELECT v FROM t"]
    assert statement.startswith("SELECT v FROM t WHERE id") and not many and 0 < took <= clock.seconds["SELECT v FROM t"]
    assert clock.slowest["INSERT INTO t (id,"][3] is True  # one executemany of five rows
