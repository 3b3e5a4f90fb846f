"""`gateway serve --workers N`: several processes on one port, on SQLite (WAL) and on PostgreSQL."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import sqlalchemy
import uvicorn
from uvicorn.supervisors.multiprocess import SIGNALS

from gateway.edge import worker_sockets
from gateway.edge.worker_sockets import SocketPerWorker, spreads_connections
from scripts.processes import TENANT_KEY, Gateway, fake_upstream, free_port, write_config


def _turn(url: str, n: int) -> tuple[int, str]:
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": f"task {n}"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": json.dumps(
                        {"command": f"cat file_{n}.txt"})}}]},
                {"role": "tool", "tool_call_id": f"c{n}", "content": f"contents of file {n}\n" * 200}]
    response = httpx.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {TENANT_KEY}"},
                          json={"model": "fake", "messages": messages}, timeout=60)
    return response.status_code, response.headers.get("x-gateway-request-id", "")


def test_two_workers_serve_one_port_and_record_every_run(storage_url: str, tmp_path: Path) -> None:
    with fake_upstream() as upstream:
        gateway = Gateway(write_config(tmp_path, storage_url, upstream), free_port(), tmp_path / "gateway.log",
                          workers=2).start(seconds=180)  # two processes import LiteLLM at once (2 CPUs: ~60 s)
        engine = sqlalchemy.create_engine(storage_url)
        try:
            instances = 0
            deadline = time.monotonic() + 60
            while instances < 2 and time.monotonic() < deadline:  # each worker registers itself as it starts
                with engine.connect() as connection:
                    instances = connection.execute(sqlalchemy.text("SELECT count(*) FROM gateway_instances")).scalar()
                time.sleep(0.2)
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda n: _turn(gateway.url, n), range(40)))
        finally:
            gateway.stop()
        try:
            with engine.connect() as connection:
                statuses = dict(connection.execute(sqlalchemy.text("SELECT id, status FROM model_runs")).all())
                artifacts = connection.execute(sqlalchemy.text("SELECT count(*) FROM tool_artifacts")).scalar()
        finally:
            engine.dispose()
    assert [status for status, _ in answers] == [200] * 40
    assert {statuses[request_id] for _, request_id in answers} == {"ok"}  # every run recorded, none pending
    assert instances == 2
    assert artifacts == 40


def _listeners(port: int) -> int:
    """How many sockets listen on `port` on this machine (Linux: /proc/net/tcp), one per worker here."""
    return sum(1 for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
               if int(line.split()[1].rsplit(":", 1)[1], 16) == port and line.split()[3] == "0A")


def _workers(gateway: Gateway) -> list[int]:
    assert gateway.process is not None
    children = Path(f"/proc/{gateway.process.pid}/task/{gateway.process.pid}/children").read_text().split()
    return [int(pid) for pid in children  # not multiprocessing's resource tracker
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def _running(pid: int) -> bool:
    """Whether the process exists and has not exited (a zombie waits for whoever adopted it to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.2)


def _clients_at_once(url: str, clients: int, requests: int) -> list[list[str]]:
    """`clients` keep-alive clients that connect in one burst (as a fleet of agents started together, or a
    load generator), each sending `requests` requests on its one connection; the request ids each got."""

    async def client(n: int) -> list[str]:
        async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {TENANT_KEY}"}, timeout=60,
                                     limits=httpx.Limits(max_connections=1)) as http:
            ids = []
            for turn in range(requests):
                response = await http.post("/v1/chat/completions", json={"model": "fake", "messages": [
                    {"role": "user", "content": f"client {n} turn {turn}"}]})
                assert response.status_code == 200, response.text
                ids.append(response.headers["x-gateway-request-id"])
            return ids

    async def burst() -> list[list[str]]:
        return list(await asyncio.gather(*(client(n) for n in range(clients))))

    return asyncio.run(burst())


@pytest.mark.skipif(not spreads_connections(), reason="SO_REUSEPORT spreads connections only on Linux")
def test_clients_that_connect_together_are_spread_over_the_workers_and_a_killed_worker_is_replaced(
        sqlite_url: str, tmp_path: Path) -> None:
    """uvicorn's shared socket gave all 20 of these clients to one worker; a socket per worker spreads them
    (the kernel hashes each connection's addresses: one worker getting fewer than 3 of 20 has odds of about
    4 in 10,000). A worker killed with SIGKILL takes only its own connections: new ones go to the other,
    and the supervisor starts a replacement that listens and serves."""
    engine = sqlalchemy.create_engine(sqlite_url)
    pids: dict[str, int] = {}  # instance id -> pid, as each worker registered itself

    def served_by(ids: list[list[str]]) -> list[set[int]]:
        """For each client, the pids of the workers that served its requests. (A worker's instance row can
        be missing for a moment: this test's 0.5 s heartbeat on 2 busy CPUs can look like a dead worker's to
        a starting one, and the next beat writes it again.)"""
        with engine.connect() as connection:
            instances = dict(connection.execute(sqlalchemy.text("SELECT id, instance_id FROM model_runs")).all())

        def known() -> bool:
            with engine.connect() as connection:
                pids.update(connection.execute(sqlalchemy.text("SELECT id, pid FROM gateway_instances")).all())
            return all(instances[request_id] in pids for client in ids for request_id in client)

        _wait(known, 20, "the workers' instance rows")
        return [{pids[instances[request_id]] for request_id in client} for client in ids]

    with fake_upstream() as upstream:
        gateway = Gateway(write_config(tmp_path, sqlite_url, upstream), free_port(), tmp_path / "gateway.log",
                          workers=2).start(seconds=180)
        try:
            _wait(lambda: _listeners(gateway.port) == 2, 120, "both workers listening")
            first, second = _workers(gateway)
            spread = served_by(_clients_at_once(gateway.url, 20, 3))
            assert all(len(pids) == 1 for pids in spread)  # keep-alive: each client stays on its connection
            per_worker = Counter(next(iter(pids)) for pids in spread)
            assert set(per_worker) == {first, second} and min(per_worker.values()) >= 3, per_worker

            os.kill(first, signal.SIGKILL)
            _wait(lambda: first not in _workers(gateway), 10, "the killed worker reaped")
            during = served_by(_clients_at_once(gateway.url, 8, 2))  # before its replacement listens
            assert {pid for pids in during for pid in pids} <= {second, *_workers(gateway)}
            _wait(lambda: len(_workers(gateway)) == 2 and _listeners(gateway.port) == 2, 120, "a replacement")
            (replacement,) = set(_workers(gateway)) - {second}
            _wait(lambda: any(replacement in pids for pids in served_by(_clients_at_once(gateway.url, 20, 1))),
                  30, "the replacement serving")

            serving = set(_workers(gateway))  # SIGHUP: each worker replaced by one that listens and serves
            os.kill(gateway.process.pid, signal.SIGHUP)
            _wait(lambda: not serving & set(_workers(gateway)) and len(_workers(gateway)) == 2
                  and _listeners(gateway.port) == 2, 240, "both workers replaced")
            assert len(served_by(_clients_at_once(gateway.url, 20, 1))) == 20
        finally:
            gateway.stop()
            engine.dispose()


@pytest.mark.skipif(not spreads_connections(), reason="SO_REUSEPORT spreads connections only on Linux")
def test_a_second_gateway_on_a_port_in_use_refuses_to_start(tmp_path: Path) -> None:
    """SO_REUSEPORT would let a second `gateway serve --workers 2` bind the first one's port and take half
    its connections (with another config); it checks the port first and exits instead."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as a worker's socket is
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(tmp_path, f"sqlite:///{tmp_path / 'gateway.db'}", "http://127.0.0.1:9")
        result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(config),
                                 "--port", str(port), "--workers", "2"], capture_output=True, text=True, timeout=120,
                                env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert result.returncode == 1
    assert "cannot start" in result.stderr and f"127.0.0.1:{port}" in result.stderr


@pytest.mark.skipif(not spreads_connections(), reason="SO_REUSEPORT spreads connections only on Linux")
def test_a_worker_socket_that_cannot_be_bound_stops_the_start(caplog: pytest.LogCaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The port taken between the check and a worker's bind: no worker is left running, and `gateway serve`
    exits 1 (`failed`) with the address and the error logged."""
    monkeypatch.setattr(worker_sockets, "check_address_free", lambda host, port: None)  # taken after it
    with socket.socket() as taken:  # without SO_REUSEPORT: no other socket may join it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = uvicorn.Config("gateway.app:app_from_environment", factory=True, workers=2, host="127.0.0.1",
                                port=port, log_config=None)  # the test process's logging left alone
        handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}  # the supervisor takes them over
        try:
            supervisor = SocketPerWorker(config)
            supervisor.init_processes()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    assert supervisor.failed and supervisor.should_exit.is_set()
    assert supervisor.processes == []
    assert f"cannot start: 127.0.0.1:{port}" in caplog.text


@pytest.mark.skipif(not spreads_connections(), reason="PR_SET_PDEATHSIG and the socket per worker are Linux's")
def test_workers_whose_supervisor_is_killed_shut_down_and_free_the_port(sqlite_url: str, tmp_path: Path) -> None:
    """SIGKILL to the supervisor alone: its workers get SIGTERM from the kernel and shut down as on any
    SIGTERM (every run recorded, none pending), and a gateway started again on the port serves there."""
    engine = sqlalchemy.create_engine(sqlite_url)
    with fake_upstream() as upstream:
        config = write_config(tmp_path, sqlite_url, upstream)
        port = free_port()
        gateway = Gateway(config, port, tmp_path / "gateway.log", workers=2).start(seconds=180)
        workers: list[int] = []
        try:
            _wait(lambda: _listeners(port) == 2, 120, "both workers listening")
            workers = _workers(gateway)
            answered = _clients_at_once(gateway.url, 6, 2)
            assert gateway.process is not None
            os.kill(gateway.process.pid, signal.SIGKILL)
            gateway.process.wait(10)
            _wait(lambda: not any(_running(pid) for pid in workers), 60, "the orphaned workers gone")
            assert _listeners(port) == 0
        finally:
            gateway.stop()
            for pid in workers:  # none is left behind if the test fails
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        again = Gateway(config, port, tmp_path / "again.log", workers=2).start(seconds=180)
        try:
            status, _ = _turn(again.url, 1)
        finally:
            again.stop()
    with engine.connect() as connection:
        statuses = dict(connection.execute(sqlalchemy.text("SELECT id, status FROM model_runs")).all())
    engine.dispose()
    assert status == 200
    assert {statuses[request_id] for ids in answered for request_id in ids} == {"ok"}
    assert "pending" not in statuses.values()
