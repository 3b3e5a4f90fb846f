"""PostgreSQL: the request path's transactions send BEGIN with their first statements and COMMIT with their
last batch (storage/store_base.py `_in_transaction(..., folded=True)`): a capture and its outcome take four
round trips where psycopg's own BEGIN and COMMIT made them eight, store what they stored, leave nothing
behind on a failure, and give their connection back to the pool as they found it."""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from policies.transcript import message_path
from storage.record_types import CapturedThenFailed, RunOutcome, RunStart
from storage.blobs import DirectoryBlobStore
from storage.database import make_engine
from storage.records import RecordStore
from storage.schema import ModelRun
from testkit.gateway import make_store
from testkit.tcp_relay import relay_clients


@pytest.fixture
def store(postgres_url: str, tmp_path: Path) -> Iterator[RecordStore]:
    store = make_store(postgres_url, tmp_path / "blobs")
    yield store
    store.engine.dispose()


def _messages(rounds: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
    for number in range(rounds):
        call = f"call_{number}"
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call, "type": "function", "function": {"name": "read", "arguments": f'{{"n": {number}}}'}}]},
            {"role": "tool", "tool_call_id": call, "content": f"result {number}"}]
    return messages


def _start(number: int) -> RunStart:
    return RunStart(request_id=f"req_{number:032x}", tenant="acme", participant="p", model="fake",
                    upstream_model="openai/fake", stream=False, session_label="s")


class _ReadyCounter:
    """A loopback relay in front of the PostgreSQL server that counts its ReadyForQuery messages: one
    ends every round trip a client waits on (a Sync of the extended protocol, a simple query)."""

    def __init__(self, host: str, port: int) -> None:
        self.ready = 0
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        relay_clients(self._listener, self._target, self._relay)

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
        threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        pending, opening = b"", from_server
        try:
            while data := source.recv(65536):
                if from_server:
                    pending += data
                    if opening:  # the answers to libpq's SSL and GSS requests: one byte each, no message
                        pending = pending.lstrip(b"N")
                        opening = not pending
                    pending = self._count(pending)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()

    def _count(self, data: bytes) -> bytes:
        """Counts the whole messages of `data` (a type byte, then a length that counts itself); returns
        the part of a message still to come."""
        while len(data) >= 5:
            length = int.from_bytes(data[1:5], "big")
            if len(data) < 1 + length:
                break
            self.ready += data[0] == ord("Z")
            data = data[1 + length:]
        return data

    def during(self, action: Any) -> int:
        before = self.ready
        action()
        time.sleep(0.2)  # the relay's thread has counted what came back
        return self.ready - before

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def counted(postgres_url: str, tmp_path: Path) -> Iterator[tuple[RecordStore, _ReadyCounter]]:
    url = make_url(postgres_url)
    relay = _ReadyCounter(url.host or "127.0.0.1", url.port or 5432)
    # a pooled connection is never pinged before use here (storage/database.py pings those idle for a
    # second): a ping is a round trip of its own, which would land in one count or another by timing
    engine = make_engine(url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False),
                         ping_after_idle=3600)
    store = RecordStore(engine, DirectoryBlobStore(tmp_path / "blobs"))
    store.create_schema()
    yield store, relay
    store.engine.dispose()
    relay.close()


def test_a_capture_and_its_outcome_take_fewer_round_trips(counted: tuple[RecordStore, _ReadyCounter]) -> None:
    """The same requests (a conversation growing a tool round at a time) in two tenants, one folded and
    one as psycopg begins and commits: the capture spares psycopg's BEGIN and COMMIT round trips, the
    outcome its BEGIN (and its COMMIT too when the assembly's rows go with it)."""
    store, trips = counted
    taken: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
    for number in range(1, 7):
        for tenant, folds in (("acme", True), ("beta", False)):
            store._folds = folds
            start = replace(_start(number), tenant=tenant, request_id=f"req_{number:016x}{int(folds):016x}")
            capture = trips.during(lambda: store.ingest(message_path(tenant, _messages(number + 1)), start))
            finish = trips.during(lambda: store.finish_run(start.request_id, RunOutcome(status="ok", latency_ms=1.0)))
            taken[folds].append((capture, finish))
    store._folds = True
    # Which statements a request needs varies a little from one to the next (how many nodes are looked
    # up, whether the conversation's row is taken exclusively): the two tenants together, not pair by pair.
    captures, finishes = ([sum(pair[i] for pair in taken[folds]) for folds in (True, False)] for i in (0, 1))
    assert captures[1] - captures[0] >= 2 * len(taken[True])  # BEGIN and COMMIT, each request
    assert finishes[1] - finishes[0] >= len(taken[True])  # BEGIN (COMMIT too when the assembly's rows go)
    with store.engine.connect() as connection:
        statuses = list(connection.scalars(select(ModelRun.status)))
    assert statuses == ["ok"] * 12


def test_a_failing_statement_rolls_the_folded_transaction_back(store: RecordStore) -> None:
    """The run's row is in the batch that carries COMMIT, the failing row too: the server skips the
    COMMIT, and nothing of the capture is stored."""
    start = _start(1)
    too_long = replace(start, model="m" * 300)  # model_runs.model holds 256 characters
    with pytest.raises(Exception):
        store.ingest(message_path("acme", _messages(2)), too_long)
    with store.engine.connect() as connection:
        assert connection.scalar(select(ModelRun.id).where(ModelRun.id == start.request_id)) is None
    store.ingest(message_path("acme", _messages(2)), start)  # the pool's connection serves the next one
    assert store.get_run(start.request_id, "acme") is not None


def test_connections_go_back_to_the_pool_out_of_autocommit_and_idle(store: RecordStore) -> None:
    store.ingest(message_path("acme", _messages(2)), _start(1))
    store.finish_run(_start(1).request_id, RunOutcome(status="ok", latency_ms=1.0))
    with pytest.raises(Exception):
        store.ingest(message_path("acme", _messages(2)), replace(_start(2), model="m" * 300))
    for _ in range(3):
        with store.engine.connect() as connection:
            driver = connection.connection.driver_connection
            assert driver.autocommit is False
            assert driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert not any(key.startswith("gateway.") for key in connection.info)


def test_a_read_failing_after_the_folded_commit_says_the_run_is_stored(store: RecordStore,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The capture committed with its last batch: a failure of the reads after it cannot undo the run,
    so the caller is told to record its outcome (as on SQLite, where the reads follow the commit)."""

    def failing(*args: Any) -> Any:
        raise RuntimeError("the read after the capture failed")

    monkeypatch.setattr(store, "_read_after_capture", failing)
    start = _start(1)
    with pytest.raises(CapturedThenFailed, match="the read after the capture failed"):
        store.ingest(message_path("acme", _messages(2)), start)
    run = store.get_run(start.request_id, "acme")
    assert run is not None and run.run["status"] == "pending"
