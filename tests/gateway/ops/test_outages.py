"""The gateway while what it stands on is down: Redis killed mid-load (limits counted per process, or 503
under `redis.when_down: refuse`), the database cut off mid-run, and a start that cannot reach them.

Real processes where the brief is an outage: the gateway as `gateway serve`, the fake upstream, and a
redis-server of the test's own (the shared one is never stopped); the shared PostgreSQL is cut off
through a TCP proxy of the test's own.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx
import pytest
import redis
import sqlalchemy
import uvicorn
import yaml
from uvicorn.lifespan.on import LifespanOn

from gateway.app import create_app
from scripts.processes import REPO, TENANT_KEY, Gateway, RedisServer, fake_upstream, free_port, write_config
from testkit.gateway import make_store, settings_for
from testkit.tcp_proxy import TcpProxy

PRICED = {"input_cost_per_token": 0.001, "output_cost_per_token": 0.001}
CLIENTS = 10
START_SECONDS = 180  # a gateway's start, on a machine this loaded, has taken more than 60 s
ANTHROPIC = {"model": "claude-test", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def _config(folder: Path, upstream: str, redis_url: str, when_down: str) -> Path:
    path = write_config(folder, f"sqlite:///{folder / 'gateway.db'}", upstream)
    config = yaml.safe_load(path.read_text())
    config["models"][0]["litellm_params"].update(PRICED)
    config["tenants"][0].update(limits={"requests_per_minute": 1_000_000}, budget={"usd_per_day": 1_000_000})
    config["redis"] = {"url": redis_url, "when_down": when_down}
    path.write_text(yaml.safe_dump(config))
    return path


class Load:
    """CLIENTS threads sending chat requests until the block ends (at most `most` each)."""

    def __init__(self, url: str, most: int = 3000) -> None:
        self.answers: list[tuple[float, int, str, Any, httpx.Headers | None]] = []  # at, status, id, body
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(url, n, most)) for n in range(CLIENTS)]

    def __enter__(self) -> "Load":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _client(self, url: str, n: int, most: int) -> None:
        with httpx.Client(base_url=url, headers={"authorization": f"Bearer {TENANT_KEY}"}, timeout=30) as http:
            for i in range(most):
                if self._stop.is_set():
                    return
                body = {"model": "fake", "messages": [{"role": "user", "content": f"client {n} request {i}"}]}
                try:
                    response = http.post("/v1/chat/completions", json=body)
                except httpx.HTTPError as exc:  # counted as status 0: none is expected
                    self.answers.append((time.monotonic(), 0, "", repr(exc), None))
                    continue
                self.answers.append((time.monotonic(), response.status_code,
                                     response.headers.get("x-gateway-request-id", ""), _json(response),
                                     response.headers))

    def wait(self, count: int, since: float, status: int, seconds: float = 60) -> None:
        """Until `count` answers of `status` came after `since`."""
        deadline = time.monotonic() + seconds
        while sum(1 for at, got, *_ in self.answers if at > since and got == status) < count:
            assert time.monotonic() < deadline, f"fewer than {count} answers {status} in {seconds} s"
            time.sleep(0.05)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _readiness(url: str, wanted: Callable[[httpx.Response], bool], seconds: float = 30) -> httpx.Response:
    deadline = time.monotonic() + seconds
    while True:
        response = httpx.get(f"{url}/readyz", timeout=10)
        if wanted(response):
            return response
        assert time.monotonic() < deadline, f"/readyz still {response.status_code} {response.text}"
        time.sleep(0.1)


def _statuses(database: str, ids: list[str]) -> dict[str, str]:
    engine = sqlalchemy.create_engine(database)
    try:
        with engine.connect() as connection:
            rows = connection.execute(sqlalchemy.text("SELECT id, status FROM model_runs")).all()
    finally:
        engine.dispose()
    found = dict(rows)
    return {request_id: found.get(request_id, "absent") for request_id in ids}


def _log_lines(path: Path, words: str) -> int:
    return sum(1 for line in path.read_text(errors="replace").splitlines() if words in line)


def test_redis_killed_mid_load_counts_per_process_and_records_every_run(own_redis: RedisServer,
                                                                         tmp_path: Path) -> None:
    with fake_upstream() as upstream:
        log = tmp_path / "gateway.log"
        gateway = Gateway(_config(tmp_path, upstream, own_redis.url, "local"), free_port(), log).start(START_SECONDS)
        try:
            with Load(gateway.url) as load:
                load.wait(20, 0, 200)
                own_redis.kill()
                killed = time.monotonic()
                degraded = _readiness(gateway.url, lambda r: r.json().get("down") == ["redis"])
                tolerated = httpx.get(f"{gateway.url}/readyz", params={"degraded": "ok"}, timeout=10)
                load.wait(50, killed, 200)  # served on per-process limits while Redis is away
                own_redis.start()
                restarted = time.monotonic()
                ready = _readiness(gateway.url, lambda r: r.status_code == 200 and r.json()["status"] == "ready")
                load.wait(50, restarted, 200)
            # A call that was late under load marks Redis down until a ping answers, and the counters it
            # could not add to go: one request once Redis is up again reads (so re-seeds) the counter.
            _readiness(gateway.url, lambda r: r.status_code == 200 and r.json()["status"] == "ready")
            last = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=30,
                              headers={"authorization": f"Bearer {TENANT_KEY}"},
                              json={"model": "fake", "messages": [{"role": "user", "content": "the last one"}]})
            metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
        finally:
            gateway.stop()
    answers = load.answers + [(time.monotonic(), last.status_code, last.headers.get("x-gateway-request-id", ""))]
    assert {status for _, status, *_ in answers} == {200}, [a for a in answers if a[1] != 200][:3]
    assert (degraded.status_code, degraded.json()) == (503, {"status": "degraded", "down": ["redis"]})
    # what the shipped probes ask: a replica serving on per-process limits stays in rotation
    assert (tolerated.status_code, tolerated.json()) == (200, {"status": "degraded", "down": ["redis"]})
    assert ready.json() == {"status": "ready"}
    assert "gateway_redis_up 1.0" in metrics and "gateway_redis_outages_total 1.0" in metrics
    assert _log_lines(log, "does not answer") == 1 and _log_lines(log, "answers again") == 1
    statuses = _statuses(f"sqlite:///{tmp_path / 'gateway.db'}", [request_id for _, _, request_id, *_ in answers])
    assert set(statuses.values()) == {"ok"} and len(statuses) == len(answers)
    # The day's counter, re-seeded from the database once Redis came back empty, holds every recorded
    # cost, the outage's included (give or take the runs in flight while it was seeded).
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'gateway.db'}")
    with engine.connect() as connection:
        recorded, most = connection.execute(sqlalchemy.text("SELECT sum(cost_usd), max(cost_usd) FROM model_runs")).one()
    engine.dispose()
    day = datetime.now(timezone.utc).strftime("d%Y%m%d")
    counter = float(redis.Redis.from_url(own_redis.url).get(f"gw:spend:tenant:acme:{day}") or 0)
    assert recorded > 0 and abs(counter - recorded) <= CLIENTS * most


def test_redis_killed_under_refuse_answers_503_in_the_callers_format(own_redis: RedisServer, tmp_path: Path) -> None:
    with fake_upstream() as upstream:
        gateway = Gateway(_config(tmp_path, upstream, own_redis.url, "refuse"), free_port(),
                          tmp_path / "gateway.log").start(START_SECONDS)
        try:
            with Load(gateway.url) as load:
                load.wait(20, 0, 200)
                own_redis.kill()
                killed = time.monotonic()
                unavailable = _readiness(gateway.url, lambda r: r.status_code == 503)
                load.wait(20, killed, 503)
                anthropic = httpx.post(f"{gateway.url}/v1/messages", json=ANTHROPIC, timeout=30,
                                       headers={"x-api-key": TENANT_KEY, "anthropic-version": "2023-06-01"})
                own_redis.start()
                restarted = time.monotonic()
                ready = _readiness(gateway.url, lambda r: r.status_code == 200)
                load.wait(20, restarted, 200)
        finally:
            gateway.stop()
    answers = load.answers
    assert {status for _, status, *_ in answers} == {200, 503}, [a for a in answers if a[1] not in (200, 503)][:3]
    assert unavailable.json() == {"status": "unavailable", "down": ["redis"]}
    assert ready.json() == {"status": "ready"}
    for _, status, _, body, headers in answers:
        if status == 503:
            assert body["error"]["code"] == "redis_unavailable" and body["error"]["type"] == "api_error"
            assert headers is not None and int(headers["retry-after"]) > 0
    assert anthropic.status_code == 503 and anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "overloaded_error"
    statuses = _statuses(f"sqlite:///{tmp_path / 'gateway.db'}", [request_id for _, _, request_id, *_ in answers])
    assert {statuses[request_id] for _, status, request_id, *_ in answers if status == 200} == {"ok"}
    # a refused request was refused before its run opened, or its run records the refusal
    assert {statuses[request_id] for _, status, request_id, *_ in answers if status == 503} <= {"absent", "error"}


def test_database_cut_off_answers_503_and_claims_no_run(postgres_url: str, tmp_path: Path) -> None:
    parts = urlsplit(postgres_url)
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 5432)).start()
    proxied = postgres_url.replace(f"@{parts.netloc.split('@')[1]}", f"@127.0.0.1:{proxy.port}")
    make_store(postgres_url, tmp_path / "blobs").engine.dispose()  # migrated directly: the start stays quick
    chat = {"model": "fake", "messages": [{"role": "user", "content": "hello"}]}
    try:
        with fake_upstream() as upstream:
            gateway = Gateway(write_config(tmp_path, proxied, upstream), free_port(),
                              tmp_path / "gateway.log").start(START_SECONDS)
            try:
                with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {TENANT_KEY}"},
                                  timeout=30) as http:
                    first = http.post("/v1/chat/completions", json=chat)
                    # its outcome is written after the answer is sent: read back before the cut
                    assert http.get(f"/api/requests/{first.headers['x-gateway-request-id']}").json()["status"] == "ok"
                    proxy.stop()
                    down = http.get("/readyz")
                    refused = http.post("/v1/chat/completions", json=chat)
                    streamed = http.post("/v1/chat/completions", json={**chat, "stream": True})
                    anthropic = http.post("/v1/messages", json=ANTHROPIC, headers={"anthropic-version": "2023-06-01"})
                    proxy.start()
                    ready = _readiness(gateway.url, lambda r: r.status_code == 200)
                    again = http.post("/v1/chat/completions", json=chat)
                forwarded = httpx.get(f"{upstream}/_requests", timeout=10).json()
            finally:
                gateway.stop()
    finally:
        proxy.stop()
    assert first.status_code == 200 and again.status_code == 200
    assert (down.status_code, down.json()) == (503, {"status": "unavailable", "down": ["database"]})
    assert ready.json() == {"status": "ready"}
    for response in (refused, streamed):
        error = response.json()["error"]
        assert response.status_code == 503 and error["code"] == "storage_unavailable", response.text
        assert "not recorded" in error["message"] and int(response.headers["retry-after"]) > 0
    assert anthropic.status_code == 503 and anthropic.json()["error"]["type"] == "overloaded_error"
    assert "not recorded" in anthropic.json()["error"]["message"]
    assert len(forwarded) == 2  # nothing was forwarded while the database was away
    ids = [r.headers["x-gateway-request-id"] for r in (first, refused, streamed, anthropic, again)]
    assert list(_statuses(postgres_url, ids).values()) == ["ok", "absent", "absent", "absent", "ok"]
    assert _log_lines(tmp_path / "gateway.log", "the database does not answer") <= 1


def _serve(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(config),
                           "--port", str(free_port())], capture_output=True, text=True, timeout=120, cwd=REPO)


@pytest.mark.parametrize("what", ["sqlite", "postgresql", "redis"])
def test_a_start_that_cannot_reach_what_it_needs_says_so_in_one_line(what: str, tmp_path: Path) -> None:
    dead = free_port()
    storage = {"sqlite": f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'gateway.db'}",
               "postgresql": f"postgresql+psycopg://postgres:s3cret@127.0.0.1:{dead}/test",
               "redis": f"sqlite:///{tmp_path / 'gateway.db'}"}[what]
    path = write_config(tmp_path, storage, "http://127.0.0.1:9")
    if what == "redis":
        config = yaml.safe_load(path.read_text())
        config["redis"] = {"url": f"redis://:s3cret@127.0.0.1:{dead}/0", "when_down": "refuse"}
        path.write_text(yaml.safe_dump(config))
    started = _serve(path)
    said = {"sqlite": f"database {storage}: unable to open database file",
            "postgresql": f"database postgresql+psycopg://postgres:***@127.0.0.1:{dead}/test: ",
            "redis": f"redis redis://:***@127.0.0.1:{dead}/0: "}[what]
    assert started.returncode == 1
    [line] = started.stderr.splitlines()  # one JSON line, as every line the server writes
    record = json.loads(line)
    assert (record["level"], record["logger"]) == ("error", "gateway")
    line = record["message"]
    assert line.startswith(f"gateway: cannot start: {said}"), line
    assert what == "sqlite" or "refused" in line.lower()
    assert "s3cret" not in started.stderr and "Traceback" not in started.stderr


async def test_a_start_failing_inside_the_server_is_one_line_too(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Past the CLI's checks (the database gone in between, or `create_app` served by hand)."""
    url = f"sqlite:///{tmp_path / 'no' / 'such' / 'gateway.db'}"
    config = uvicorn.Config(create_app(settings_for("http://127.0.0.1:9/v1", url, tmp_path)), lifespan="on",
                            log_config=None)
    config.load()
    lifespan = LifespanOn(config)
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        await lifespan.startup()
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert lifespan.should_exit
    assert errors[0] == f"gateway: cannot start: database {url}: unable to open database file"
    assert not any("Traceback" in message for message in errors)
