"""Reloading the config and policy files while serving (issue 13): SIGHUP, the admin API and the file
watch; requests in flight finish under the config they began with; a broken file changes nothing."""
from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

from gateway.config import load_settings
from scripts.processes import Gateway, fake_upstream, free_port
from testkit.gateway import ADMIN_KEY, TENANT_KEY, RunningGateway, start_gateway
from testkit.fake_upstream import FakeUpstream

ROUND = [
    {"role": "user", "content": "read it"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"a.py\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "def f():\n    return 1\n" * 40},
]


def policy(version: int, min_tokens: int = 200) -> dict[str, Any]:
    return {"name": "team", "version": version, "compaction": {"keep_recent_rounds": 1, "min_tokens": min_tokens}}


def write_files(folder: Path, api_base: str, storage_url: str, *, version: int = 1, keys: list[str] | None = None,
                **extra: Any) -> Path:
    (folder / "team.yaml").write_text(yaml.safe_dump(policy(version)))
    config = {
        "models": [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": api_base,
                                                        "api_key": "sk-upstream"}}],
        "tenants": [{"id": "acme", "api_keys": keys or [TENANT_KEY], "policy": "team.yaml"}],
        "admin_keys": [ADMIN_KEY],
        "storage": {"url": storage_url, "blob_dir": str(folder / "blobs")},
        **extra,
    }
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def policy_version_of(http: httpx.Client, request_id: str) -> str:
    record = http.get(f"/api/requests/{request_id}", headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
    return record["assembly"]["policy"]["version"]


def ask(http: httpx.Client, key: str = TENANT_KEY, **body: Any) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"model": "fake", "messages": ROUND, **body},
                     headers={"authorization": f"Bearer {key}"})


@pytest.fixture
def served(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[tuple[RunningGateway, Path]]:
    path = write_files(tmp_path, fake.api_base, sqlite_url)
    running, server = start_gateway(load_settings(path), fake)
    yield running, path
    server.stop()


def test_the_admin_api_reloads_keys_and_policies_and_refuses_a_broken_file(
        served: tuple[RunningGateway, Path], tmp_path: Path, sqlite_url: str) -> None:
    gateway, path = served
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        before = ask(http)
        old_version = policy_version_of(http, before.headers["x-gateway-request-id"])
        write_files(tmp_path, gateway.fake.api_base, sqlite_url, version=2, keys=["sk-new-key"])
        assert ask(http).status_code == 200  # nothing changes until a reload
        refused_tenant = http.post("/api/admin/reload", headers={"authorization": f"Bearer {TENANT_KEY}"})
        reloaded = http.post("/api/admin/reload", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        old_key, new_key = ask(http), ask(http, key="sk-new-key")
        new_version = policy_version_of(http, new_key.headers["x-gateway-request-id"])
        # a config that does not load: refused with its error, the running one stays
        path.write_text(path.read_text().replace("tenants:", "tenantz:"))
        broken = http.post("/api/admin/reload", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        still = ask(http, key="sk-new-key")
    assert before.status_code == 200 and refused_tenant.status_code == 403
    assert reloaded.status_code == 200 and reloaded.json()["ok"] is True
    assert reloaded.json()["policies"]["acme"].startswith("team v2")
    assert old_key.status_code == 401 and new_key.status_code == 200
    assert old_version.startswith("v1-") and new_version.startswith("v2-")
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_config"
    assert re.search(r"tenantz \(line \d+\): unknown field; did you mean 'tenants'\?", broken.json()["error"]["message"])
    assert broken.json()["reload"]["ok"] is False
    assert still.status_code == 200 and policy_version_of(httpx.Client(base_url=gateway.url),
                                                          still.headers["x-gateway-request-id"]) == new_version


def test_a_stream_in_flight_finishes_under_its_policy_and_the_next_request_uses_the_new(
        served: tuple[RunningGateway, Path], tmp_path: Path, sqlite_url: str) -> None:
    gateway, path = served
    gateway.fake.script_message({"role": "assistant", "content": "a slow streamed answer " * 8}, chunk_delay=0.1)
    streamed: dict[str, Any] = {}

    def stream() -> None:
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            with http.stream("POST", "/v1/chat/completions", json={"model": "fake", "messages": ROUND, "stream": True},
                             headers={"authorization": f"Bearer {TENANT_KEY}"}) as response:
                streamed["id"] = response.headers["x-gateway-request-id"]
                streamed["body"] = response.read().decode()

    worker = threading.Thread(target=stream)
    worker.start()
    time.sleep(0.4)  # the stream has begun
    write_files(tmp_path, gateway.fake.api_base, sqlite_url, version=3)
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        reloaded = http.post("/api/admin/reload", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert worker.is_alive()  # the reload did not wait for the stream, nor end it
        worker.join(30)
        after = ask(http)
        during = policy_version_of(http, streamed["id"])
        run = http.get(f"/api/requests/{streamed['id']}", headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
        next_version = policy_version_of(http, after.headers["x-gateway-request-id"])
    assert reloaded.json()["ok"] is True
    assert streamed["body"].rstrip().endswith("data: [DONE]") and run["status"] == "ok"
    assert during.startswith("v1-") and next_version.startswith("v3-")


def test_restart_only_settings_are_named_and_keep_their_running_values(
        served: tuple[RunningGateway, Path], tmp_path: Path, sqlite_url: str) -> None:
    gateway, path = served
    write_files(tmp_path, gateway.fake.api_base, sqlite_url, log_level="debug", server={"port": 4999, "docs": True})
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        reloaded = http.post("/api/admin/reload", headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
        docs = http.get("/docs")
    assert reloaded["ok"] is True
    assert set(reloaded["needs_restart"]) == {"log_level", "server.port", "server.docs"}
    assert docs.status_code == 404
    services = gateway.app.state.services
    assert services.settings.log_level == "info" and services.settings.server.port == 4000


def test_sighup_and_the_file_watch_reload_a_running_gateway_serve(sqlite_url: str, tmp_path: Path) -> None:
    with fake_upstream() as upstream:
        path = write_files(tmp_path, f"{upstream}/v1", sqlite_url, log_level="warning",
                           server={"watch_config": True})
        gateway = Gateway(path, free_port(), tmp_path / "gateway.log").start()
        try:
            with httpx.Client(base_url=gateway.url, timeout=30) as http:
                assert ask(http).status_code == 200
                # SIGHUP: a new key works at once after it
                write_files(tmp_path, f"{upstream}/v1", sqlite_url, keys=[TENANT_KEY, "sk-hup"], log_level="warning",
                            server={"watch_config": True})
                assert gateway.process is not None
                os.kill(gateway.process.pid, signal.SIGHUP)
                assert eventually(lambda: ask(http, key="sk-hup").status_code == 200)
                # the watch: a policy file edited on disk is in use within seconds, without a signal
                (tmp_path / "team.yaml").write_text(yaml.safe_dump(policy(7, min_tokens=100)))
                assert eventually(lambda: policy_version_of(
                    http, ask(http).headers["x-gateway-request-id"]).startswith("v7-"))
                # a broken edit is refused and logged; the gateway keeps serving the last good config
                (tmp_path / "team.yaml").write_text("compaction: [not, a, mapping\n")
                time.sleep(3)
                kept = ask(http, key="sk-hup")
                assert kept.status_code == 200
                assert policy_version_of(http, kept.headers["x-gateway-request-id"]).startswith("v7-")
        finally:
            gateway.stop()
    log = (tmp_path / "gateway.log").read_text()
    assert "config reload refused" in log and "team.yaml" in log


def eventually(check: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False
