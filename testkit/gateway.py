"""A gateway on a real socket for tests and benchmarks: settings, keys, a runner, the shared traces.

Importing this module sets LiteLLM's offline environment first (the local price map, tiktoken's
bundled encodings), as `gateway serve` does.
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx  # noqa: E402

from gateway.upstream.encodings import use_bundled_encodings  # noqa: E402

use_bundled_encodings()

from gateway.app import create_app  # noqa: E402
from gateway.config import Settings, parse_settings  # noqa: E402
from storage.blobs import DirectoryBlobStore  # noqa: E402
from storage.database import make_engine  # noqa: E402
from storage.records import RecordStore  # noqa: E402
from testkit.fake_upstream import FakeUpstream, ServerThread  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TRACES_DIR = REPO / "tests" / "data" / "traces"  # copied into the repository, sources in its README

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

TENANT_KEY = "sk-acme-1"
OTHER_TENANT_KEY = "sk-globex-1"
ADMIN_KEY = "sk-admin"


def within_one_rate_window(seconds_needed: float = 15.0) -> None:
    """Sleep into the next minute when fewer than `seconds_needed` remain of this one.

    Rate limits count in fixed one-minute windows of the wall clock: a test whose
    second request must be refused fails if the window turns between its requests.
    """
    left = 60.0 - time.time() % 60.0
    if left < seconds_needed:
        time.sleep(left + 0.05)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_store(url: str, blob_dir: Path, inline_max_bytes: int = 64 * 1024) -> RecordStore:
    store = RecordStore(make_engine(url), DirectoryBlobStore(blob_dir), inline_max_bytes=inline_max_bytes)
    store.create_schema()
    return store


def settings_for(api_base: str, storage_url: str, tmp_path: Path, **overrides: Any) -> Settings:
    raw: dict[str, Any] = {
        "models": [
            {"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": api_base,
                                                 "api_key": "sk-upstream"}},
            {"name": "demo", "litellm_params": {"model": "openai/demo", "mock_response": "demo says hi"}},
        ],
        "tenants": [
            {"id": "acme", "api_keys": [TENANT_KEY], "policy": "default"},
            {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "policy": "default"},
        ],
        "admin_keys": [ADMIN_KEY],
        "storage": {"url": storage_url, "blob_dir": str(tmp_path / "blobs")},
        # Upstream failures reach the client at once, so a test of one scripted failure sees it;
        # tests/gateway/upstream/test_deployments.py tests the retries (router.num_retries defaults to 2).
        "router": {"num_retries": 0},
    }
    for key, value in overrides.items():
        raw[key] = value
    return parse_settings(raw, "<test>", str(tmp_path))


@dataclass
class RunningGateway:
    url: str
    settings: Settings
    app: Any
    fake: FakeUpstream

    @property
    def api_base(self) -> str:
        return f"{self.url}/v1"

    @property
    def store(self) -> RecordStore:
        return self.app.state.services.store

    def client(self, key: str = TENANT_KEY, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"},
                            timeout=60, **kwargs)


def dashboard_form_token(client: httpx.Client, path: str = "/dashboard/login") -> str:
    """The `csrf_token` of a dashboard page's forms (the client keeps the `gw_csrf` cookie it is bound to)."""
    page = client.get(path)
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)


def dashboard_sign_in(client: httpx.Client, key: str) -> httpx.Response:
    """Sign in through the dashboard's form as a browser does: the key and the form's token."""
    return client.post("/dashboard/login", data={"api_key": key, "csrf_token": dashboard_form_token(client)})


def start_gateway(settings: Settings, fake: FakeUpstream) -> tuple[RunningGateway, ServerThread]:
    app = create_app(settings)
    server = ServerThread(app).start()
    return RunningGateway(url=server.url, settings=settings, app=app, fake=fake), server


def load_trace(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8").strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text.splitlines()[0])


def trace_files() -> list[Path]:
    return sorted(TRACES_DIR.glob("*.jsonl"))
