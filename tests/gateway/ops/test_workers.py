"""`gateway serve --workers N`: several processes on one socket, on SQLite (WAL) and on PostgreSQL."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import sqlalchemy

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


def test_two_workers_serve_one_socket_and_record_every_run(storage_url: str, tmp_path: Path) -> None:
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
