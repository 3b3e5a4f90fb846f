"""kill -9 in the middle of a request: after a restart the run is settled and nothing is lost.

The gateway runs as a real `gateway serve` process (scripts/processes.py);
`scripts/crash_recovery.py` runs the longer campaign (five kills during a
replayed trace) that the closing notes quote.
"""
from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import sqlalchemy

from scripts.processes import TENANT_KEY, Gateway, fake_upstream, free_port, write_config
from tests.conftest import service_unavailable

MESSAGES = [{"role": "system", "content": "You are a build agent."}, {"role": "user", "content": "Build it."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "make"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "compiling module 1 of 9\n" * 200}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with fake_upstream(delay=2.0) as url:
        yield url


def runs(storage_url: str) -> dict[str, str]:
    engine = sqlalchemy.create_engine(storage_url)
    try:
        with engine.connect() as conn:
            return dict(conn.execute(sqlalchemy.text("SELECT id, status FROM model_runs")).all())
    except sqlalchemy.exc.OperationalError as exc:
        service_unavailable("the database", exc)
        raise
    finally:
        engine.dispose()


def test_a_run_killed_mid_request_is_settled_after_restart(upstream: str, storage_url: str, tmp_path: Path) -> None:
    gateway = Gateway(write_config(tmp_path, storage_url, upstream), free_port(), tmp_path / "gateway.log").start()
    headers = {"Authorization": f"Bearer {TENANT_KEY}"}
    body = {"model": "fake", "messages": MESSAGES}
    try:
        def in_flight() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the connection dies with the process
                httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=30)

        doomed = threading.Thread(target=in_flight)
        doomed.start()
        deadline = time.monotonic() + 20
        while "pending" not in runs(storage_url).values():  # captured and forwarded: now in flight
            assert time.monotonic() < deadline, "the request never reached the upstream"
            time.sleep(0.02)
        gateway.kill()
        doomed.join(30)
        [killed] = [run_id for run_id, status in runs(storage_url).items() if status == "pending"]
        gateway.start()
        deadline = time.monotonic() + 20
        while runs(storage_url)[killed] == "pending":
            assert time.monotonic() < deadline, "the killed run was never settled"
            time.sleep(0.1)
        assert runs(storage_url)[killed] == "interrupted"
        with httpx.Client(base_url=gateway.url, headers=headers, timeout=30) as http:
            record = http.get(f"/api/requests/{killed}").json()
            assert record["error"]["type"] == "interrupted"
            artifact = http.get(f"/api/artifacts/{record['path_artifact_ids'][0]}")
            assert artifact.content == MESSAGES[-1]["content"].encode()  # captured before the kill, intact
            retry = http.post("/v1/chat/completions", json=body)  # the agent sends the turn again
            assert retry.status_code == 200
            assert http.get(f"/api/requests/{retry.headers['x-gateway-request-id']}").json()["path_artifact_ids"] \
                == record["path_artifact_ids"]
    finally:
        gateway.stop()
