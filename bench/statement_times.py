"""The database statements of a request: how many, of which kind, and how long each kind takes.

    .venv/bin/python bench/statement_times.py [--messages 1000] [--requests 60] [--postgres URL] [--explain]

The real app (`gateway.app.create_app`, uvicorn in a thread of this process, tenant `acme` under the
`coding-agent` policy) on a fresh SQLite file, or a fresh schema of the PostgreSQL server at --postgres,
in front of the constant upstream (bench/constant_upstream.py, a process of its own). One client sends
a synthetic coding-agent session of --messages messages (bench/bench_transcripts.py), alternating the
transcript as it is and the transcript plus one tool round never seen before, --warmup requests and
then --requests measured ones, each after the answer to the one before. Every statement the engine
sends while the measured requests run, and until the gateway has written their outcomes, is timed
from the cursor's execute to its return (SQLAlchemy's before/after_cursor_execute events), grouped by
its first words.

Prints the wall time per request, the statements per request and, per kind, the milliseconds per
request, the count per request and the slowest one. The time is the statement's as this process
sees it: the round trip and the server's work, and on a busy process the wait for the GIL once the
answer is in (a thread that gave the GIL up for a round trip waits up to `sys.getswitchinterval()` for
it again while another thread runs Python). --explain then runs EXPLAIN (ANALYZE, BUFFERS) on the
slowest SELECT and UPDATE of the kinds that took longest (PostgreSQL; rolled back).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx  # noqa: E402
from sqlalchemy import event  # noqa: E402

from bench_transcripts import TOOLS, Transcript, alternating_sender, synthetic_session  # noqa: E402
from conversation_memory import Gateway, wait_for_outcomes  # noqa: E402
from scripts.processes import postgres_schema  # noqa: E402
from storage.driver_statements import DriverStatements  # noqa: E402

KIND_WORDS = 4  # a statement's kind: its first words


def kind_of(statement: str) -> str:
    return " ".join(statement.split()[:KIND_WORDS])[:80]


class StatementClock:
    """Times every statement an engine sends while `on`, by kind; keeps the slowest of each kind."""

    def __init__(self, engine: Any) -> None:
        self.on = False
        self.seconds: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()
        self.slowest: dict[str, tuple[float, str, Any, bool]] = {}
        self._started: dict[int, float] = {}
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)
        self._time_driver_statements()

    def _time_driver_statements(self) -> None:
        """SQLite's request path runs its statements on the driver's cursor (storage/driver_statements.py),
        past SQLAlchemy's events: each such run timed too, as the statement it sends (its processing of
        parameters and rows included, a few microseconds)."""
        run = DriverStatements.run
        clock = self

        def timed(driver: DriverStatements, connection: Any, statement: Any, parameters: Any = None) -> list[Any]:
            started = time.perf_counter()
            try:
                return run(driver, connection, statement, parameters)
            finally:
                many = isinstance(parameters, (list, tuple))
                if clock.on and (parameters or not many):
                    first = parameters[0] if many else (parameters or {})
                    compiled = driver.compiled(statement, tuple(first) if many else None)
                    # as the driver got them (the statement's constants bound too): what --explain sends
                    sent = parameters if many else compiled.values(first)
                    clock._count(time.perf_counter() - started, compiled.sql, sent, many)

        DriverStatements.run = timed  # type: ignore[method-assign]

    def _before(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        self._started[id(cursor)] = time.perf_counter()

    def _after(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        started = self._started.pop(id(cursor), None)
        if not self.on or started is None:
            return
        self._count(time.perf_counter() - started, statement, parameters, many)

    def _count(self, took: float, statement: str, parameters: Any, many: bool) -> None:
        kind = kind_of(statement)
        self.seconds[kind] += took
        self.counts[kind] += 1
        if took > self.slowest.get(kind, (0.0,))[0]:
            self.slowest[kind] = (took, statement, parameters, many)


def explain(engine: Any, clock: StatementClock, kinds: int) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of the slowest SELECT and UPDATE of the `kinds` kinds that took longest."""
    with engine.connect() as connection:
        raw = connection.connection.dbapi_connection
        for kind, _ in clock.seconds.most_common(kinds):
            took, statement, parameters, many = clock.slowest[kind]
            if many or not kind.startswith(("SELECT", "UPDATE")):
                continue
            cursor = raw.cursor()
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)
            print(f"\n== {kind} (slowest: {took * 1000:.2f} ms)")
            for (line,) in cursor.fetchall():
                print(f"   {line[:200]}")
            raw.rollback()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000, help="of the transcript (default 1000)")
    parser.add_argument("--requests", type=int, default=60, help="measured requests (default 60)")
    parser.add_argument("--warmup", type=int, default=30, help="requests first, not measured (default 30)")
    parser.add_argument("--postgres", metavar="URL", help="a fresh schema of this PostgreSQL server, not SQLite")
    parser.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE the slowest kinds (PostgreSQL)")
    args = parser.parse_args()
    if args.requests < 1 or args.warmup < 0 or args.messages < 4:
        raise SystemExit("--requests >= 1, --warmup >= 0, --messages >= 4")
    transcript = Transcript(f"synthetic-{args.messages}", synthetic_session(args.messages, 7), TOOLS, False)
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="statement-times-")))
        url = stack.enter_context(postgres_schema(args.postgres) if args.postgres
                                  else nullcontext(f"sqlite:///{folder / 'gateway.db'}"))
        gateway = stack.enter_context(Gateway(folder, storage_url=url))
        services = gateway.services
        clock = StatementClock(services.store.engine)
        with httpx.Client(base_url=gateway.api_base, headers=gateway.headers, timeout=120, trust_env=False) as client:
            send = alternating_sender(client, transcript)
            for number in range(args.warmup):
                send(number)
            wait_for_outcomes()
            clock.on = True
            started = time.perf_counter()
            for number in range(args.requests):
                send(number)
            wall = time.perf_counter() - started
            wait_for_outcomes()
            clock.on = False
        n = args.requests
        print(f"{transcript.name} on {'PostgreSQL' if args.postgres else 'SQLite'}: {wall / n * 1000:.2f} ms a request "
              f"(wall), {sum(clock.counts.values()) / n:.2f} statements and "
              f"{sum(clock.seconds.values()) / n * 1000:.2f} ms of them a request")
        print(f"{'ms/request':>10}  {'count':>6}  {'slowest':>8}  statement")
        for kind, seconds in clock.seconds.most_common():
            print(f"{seconds / n * 1000:>10.3f}  {clock.counts[kind] / n:>6.2f}  {clock.slowest[kind][0] * 1000:>8.2f}  {kind}")
        if args.explain and args.postgres:
            explain(services.store.engine, clock, 6)


if __name__ == "__main__":
    main()
