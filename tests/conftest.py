"""Shared fixtures: a fake upstream, fresh databases, a gateway on a real socket, fresh memos.

PostgreSQL and Redis tests use the real servers named by
GATEWAY_TEST_POSTGRES_URL / GATEWAY_TEST_REDIS_URL (defaults: the local
ones). Where a server is unreachable those tests skip and say why, unless
GATEWAY_TEST_REQUIRE_SERVICES=1 (set by .ci/run), which makes them fail.
"""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest  # noqa: E402
import sqlalchemy  # noqa: E402

from gateway.upstream.encodings import use_bundled_encodings  # noqa: E402

use_bundled_encodings()

from policies.memo import reset_memos  # noqa: E402
from scripts.processes import RedisServer  # noqa: E402
from storage.blobs import BlobStore, DirectoryBlobStore  # noqa: E402
from storage.s3_blobs import S3BlobStore  # noqa: E402
from testkit.fake_upstream import FakeUpstream  # noqa: E402
from testkit.gateway import (  # noqa: E402,F401  (the helpers tests import from here)
    ADMIN_KEY,
    OTHER_TENANT_KEY,
    REPO,
    TENANT_KEY,
    TRACES_DIR,
    WEATHER_TOOL,
    RunningGateway,
    dashboard_form_token,
    dashboard_sign_in,
    free_port,
    load_trace,
    make_store,
    settings_for,
    start_gateway,
    trace_files,
)

POSTGRES_URL = os.environ.get(
    "GATEWAY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REQUIRE_SERVICES = os.environ.get("GATEWAY_TEST_REQUIRE_SERVICES") == "1"


def installed(path: Path, install_hint: str) -> Path:
    """A client CLI the tests drive, or a skip (a failure under GATEWAY_TEST_REQUIRE_SERVICES=1) that says why."""
    if not path.exists():
        message = f"{path} not found: {install_hint}"
        if REQUIRE_SERVICES:
            pytest.fail(f"{message}; GATEWAY_TEST_REQUIRE_SERVICES=1 makes it mandatory")
        pytest.skip(message)
    return path


def service_unavailable(name: str, error: Exception) -> None:
    message = f"{name} unreachable ({type(error).__name__}: {error})"
    if REQUIRE_SERVICES:
        pytest.fail(f"{message}; GATEWAY_TEST_REQUIRE_SERVICES=1 makes it mandatory")
    pytest.skip(message)


@pytest.fixture
def fresh_memos() -> Iterator[None]:
    """Every memo of the process cleared before the test and after it (policies/memo.py: the one way to
    reset memoised state)."""
    reset_memos()
    yield
    reset_memos()


@pytest.fixture(scope="session")
def fake_upstream_server() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


@pytest.fixture
def fake(fake_upstream_server: FakeUpstream) -> Iterator[FakeUpstream]:
    """The session's fake upstream, emptied; a responder a test sets is taken away after it."""
    fake_upstream_server.reset()
    yield fake_upstream_server
    state = fake_upstream_server.state
    state.responder = state.responses_responder = state.chat_responder = state.gemini_responder = None


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL schema for one test, dropped afterwards."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    admin = sqlalchemy.create_engine(POSTGRES_URL)
    try:
        with admin.begin() as conn:
            conn.execute(sqlalchemy.text(f'CREATE SCHEMA "{schema}"'))
    except sqlalchemy.exc.OperationalError as exc:
        admin.dispose()
        service_unavailable("PostgreSQL", exc)
    separator = "&" if "?" in POSTGRES_URL else "?"
    yield f"{POSTGRES_URL}{separator}options=-csearch_path%3D{schema}"
    with admin.begin() as conn:
        conn.execute(sqlalchemy.text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture
def redis_url() -> Iterator[str]:
    """The real Redis server, reachable; each test gets its own key prefix via `redis_prefix`."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        service_unavailable("Redis", exc)
    finally:
        client.close()
    yield REDIS_URL


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    import redis

    prefix = f"gwtest:{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
    client.close()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, on a free port, to kill or freeze (never the shared one)."""
    if shutil.which("redis-server") is None:
        service_unavailable("redis-server", FileNotFoundError("not on PATH"))
    server = RedisServer(free_port()).start()
    yield server
    server.kill()


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gateway.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'gateway.db'}"


S3_CREDENTIALS = {"region": "us-east-1", "access_key_id": "testing", "secret_access_key": "testing"}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A local S3-compatible server (moto's, in this process) for the S3 blob store."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A new, empty bucket on the local S3 server."""
    name = f"blobs-{uuid.uuid4().hex[:16]}"
    S3BlobStore.connect(name, endpoint_url=s3_endpoint, **S3_CREDENTIALS).client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_blobs(s3_endpoint: str, s3_bucket: str) -> S3BlobStore:
    return S3BlobStore.connect(s3_bucket, prefix="gw/blobs", endpoint_url=s3_endpoint, **S3_CREDENTIALS)


@pytest.fixture(params=["directory", "s3"])
def any_blob_store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    """The test runs over each blob store."""
    if request.param == "directory":
        return DirectoryBlobStore(tmp_path / "blobs")
    return request.getfixturevalue("s3_blobs")


@pytest.fixture
def gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    """The gateway on a real socket, SQLite-backed, its `fake` model on the fake upstream."""
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path), fake)
    yield running
    server.stop()


@pytest.fixture
def postgres_gateway(fake: FakeUpstream, postgres_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    """The gateway on a real socket over PostgreSQL (skipped, saying why, where there is none)."""
    running, server = start_gateway(settings_for(fake.api_base, postgres_url, tmp_path), fake)
    yield running
    server.stop()


@pytest.fixture
def gateway_any_store(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    """The same gateway over SQLite and over PostgreSQL."""
    running, server = start_gateway(settings_for(fake.api_base, storage_url, tmp_path), fake)
    yield running
    server.stop()
