"""Every upstream stream closed, on every path and every exit (issue 27), against a running gateway.

`gateway serve` runs as its own process (scripts/processes.py) in front of the fake upstreams
(testkit/fake_upstream.py with its Responses and Anthropic routes), and the test counts the sockets
that process holds to the upstream (/proc/<pid>/fd and /proc/<pid>/net/tcp): a stream left open
shows as a socket in ESTABLISHED, or in CLOSE_WAIT once the upstream has hung up on it. Every kind
of stream is driven: completions, chat over the direct transport and over LiteLLM's own call,
Responses and Anthropic Messages; read to the end, abandoned after the first event, never read,
failing mid-stream and timing out mid-stream. Every request's run must end in a recorded status.
"""
from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml
from sqlalchemy import select

from scripts.processes import TENANT_KEY, Gateway, fake_upstream, free_port, open_fds, sockets_to
from storage.database import make_engine
from storage.schema import ModelRun

KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "completions": ("/v1/completions", {"model": "fake", "prompt": "tell me a story", "stream": True}),
    "chat": ("/v1/chat/completions",  # the direct transport
             {"model": "fake", "messages": [{"role": "user", "content": "tell me a story"}], "stream": True}),
    "chat-litellm": ("/v1/chat/completions",  # a deployment the direct transport leaves to LiteLLM's own call
                     {"model": "fake-litellm", "messages": [{"role": "user", "content": "tell me a story"}],
                      "stream": True}),
    "responses": ("/v1/responses", {"model": "gpt-4.1", "input": "tell me a story", "stream": True}),
    "messages": ("/v1/messages", {"model": "claude-haiku-4-5", "max_tokens": 200, "stream": True,
                                  "messages": [{"role": "user", "content": "tell me a story"}]}),
}
STORY = "Once upon a time a gateway closed every stream it opened. " * 3
STREAMS, CONCURRENCY, LOAD_SECONDS = 500, 8, 900.0
SETTLE_SECONDS = 30.0
KEEP_ALIVE_SECONDS = 5.0  # the fake upstream hangs up on a connection idle this long (uvicorn's default)
FD_SLACK = 12  # descriptors the gateway may keep after serving (database files, client sessions); a leak is one per stream


def _config(folder: Path, upstream: str, timeout: float) -> Path:
    openai = {"api_base": f"{upstream}/v1", "api_key": "sk-upstream"}
    config = {
        "models": [{"name": "fake", "litellm_params": {"model": "openai/fake", **openai}},
                   {"name": "fake-litellm", "litellm_params": {"model": "openai/fake", "organization": "org-test",
                                                               **openai}},
                   {"name": "gpt-4.1", "litellm_params": {"model": "openai/gpt-4.1", **openai}},  # streams natively
                   {"name": "claude-*", "litellm_params": {"model": "anthropic/claude-*", "api_base": upstream,
                                                            "api_key": "sk-upstream"}}],
        "tenants": [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "coding-agent"}],
        "storage": {"url": f"sqlite:///{folder / 'gateway.db'}", "blob_dir": str(folder / "blobs")},
        "server": {"upstream_timeout_seconds": timeout},
        "router": {"num_retries": 0},
        "log_level": "warning",
    }
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with fake_upstream() as url:
        yield url


def _gateway(upstream: str, folder: Path, timeout: float) -> Gateway:
    folder.mkdir(parents=True, exist_ok=True)
    return Gateway(_config(folder, upstream, timeout), free_port(), folder / "gateway.log").start(seconds=300)


@pytest.fixture(scope="module")
def gateway(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    running = _gateway(upstream, tmp_path_factory.mktemp("streams"), timeout=60)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def impatient_gateway(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway that gives up on an upstream silent for more than 2 s."""
    running = _gateway(upstream, tmp_path_factory.mktemp("impatient"), timeout=2)
    yield running
    running.stop()


@pytest.fixture
def step(upstream: str) -> Iterator[Any]:
    """Set the fake upstream's answer to every request (its default step) for one test."""
    def set_step(**fields: Any) -> None:
        httpx.post(f"{upstream}/_default", json=fields).raise_for_status()

    yield set_step
    httpx.post(f"{upstream}/_reset").raise_for_status()


def _client(gateway: Gateway) -> httpx.Client:
    return httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {TENANT_KEY}"}, timeout=60)


def stream(gateway: Gateway, kind: str, read: str = "all", status: int | None = 200) -> tuple[str, list[str]]:
    """One streamed request: its request id and the SSE data lines read (an error answer's body as one
    line). `read`: "all" to the end, "first" (the connection closed after the first event), "none"
    (closed without reading a byte). `status`: the HTTP status expected (None: any)."""
    path, body = KINDS[kind]
    with _client(gateway) as http, http.stream("POST", path, json=body) as response:
        assert status is None or response.status_code == status, response.read()
        request_id, data = response.headers["x-gateway-request-id"], []
        if response.status_code != 200:
            return request_id, [f"data: {response.read().decode()}"]
        if read == "none":
            return request_id, data
        for line in response.iter_lines():
            if line.startswith("data:"):
                data.append(line)
                if read == "first":
                    break
    return request_id, data


def is_error(line: str) -> bool:
    """Whether an SSE data line is an error (each format's own error event or body)."""
    payload = line.removeprefix("data:").strip()
    if payload == "[DONE]":
        return False
    event = json.loads(payload)
    return event.get("type") == "error" or bool(event.get("error"))


def upstream_sockets(gateway: Gateway, upstream: str) -> dict[str, int]:
    assert gateway.process is not None
    return sockets_to(gateway.process.pid, int(upstream.rsplit(":", 1)[1]))


def settled_sockets(gateway: Gateway, upstream: str, allowed_open: int, idle: bool = False) -> dict[str, int]:
    """The gateway's sockets to the upstream once no more than `allowed_open` are open and none is in
    CLOSE_WAIT (or as they are after SETTLE_SECONDS). `idle`: first wait until the upstream has hung up
    on the connections left idle in the gateway's pools, so what stays open is what was never closed."""
    if idle:
        time.sleep(KEEP_ALIVE_SECONDS + 2)
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        counts = upstream_sockets(gateway, upstream)
        if (counts.get("CLOSE_WAIT", 0) == 0 and counts.get("ESTABLISHED", 0) <= allowed_open) \
                or time.monotonic() > deadline:
            return counts
        time.sleep(0.5)


def stored_statuses(gateway: Gateway, request_ids: list[str]) -> dict[str, str]:
    """The status of each run as the gateway's database holds it, waiting a little for those pending."""
    engine = make_engine(f"sqlite:///{gateway.config.parent / 'gateway.db'}")
    try:
        deadline = time.monotonic() + 30
        while True:
            with engine.connect() as conn:
                query = select(ModelRun.id, ModelRun.status).where(ModelRun.id.in_(request_ids))
                found = {request_id: status for request_id, status in conn.execute(query)}
            if "pending" not in found.values() or time.monotonic() > deadline:
                return found
            time.sleep(0.5)
    finally:
        engine.dispose()


def statuses(gateway: Gateway, request_ids: list[str]) -> dict[str, str]:
    """The recorded status of each run (GET /api/requests/{id}), waiting a little for those pending."""
    def status(request_id: str) -> str:
        with _client(gateway) as http:
            deadline = time.monotonic() + 30
            while True:
                record = http.get(f"/api/requests/{request_id}")
                assert record.status_code == 200, record.text
                if record.json()["status"] != "pending" or time.monotonic() > deadline:
                    return record.json()["status"]
                time.sleep(0.2)

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(request_ids, pool.map(status, request_ids)))


def test_500_streams_read_or_abandoned_leave_no_socket_and_every_run_recorded(
        gateway: Gateway, upstream: str, step: Any) -> None:
    step(message={"content": STORY}, chunk_delay=0.005)
    for kind in KINDS:  # the pools and clients the gateway keeps are made before the baseline
        stream(gateway, kind)
    assert gateway.process is not None
    baseline_sockets = settled_sockets(gateway, upstream, allowed_open=len(KINDS), idle=True)
    baseline_fds = open_fds(gateway.process.pid)

    plan = [(list(KINDS)[i % len(KINDS)], "first" if (i // len(KINDS)) % 2 else "all") for i in range(STREAMS)]
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
        futures = [pool.submit(stream, gateway, kind, read) for kind, read in plan]
        done, late = concurrent.futures.wait(futures, timeout=LOAD_SECONDS)
        for future in late:
            future.cancel()
    assert not late, f"{len(late)} of {STREAMS} streams not done in {LOAD_SECONDS} s"
    results = [future.result() for future in futures]
    took = time.monotonic() - started
    for (kind, read), (_, data) in zip(plan, results):
        assert data, f"{kind}: no event"
        if read == "all":
            assert not is_error(data[-1]), (kind, data[-1])

    open_before = baseline_sockets.get("ESTABLISHED", 0)
    after = settled_sockets(gateway, upstream, allowed_open=open_before, idle=True)
    fds = open_fds(gateway.process.pid)
    print(f"{STREAMS} streams in {took:.1f} s; upstream sockets before {baseline_sockets}, after {after}; "
          f"descriptors before {baseline_fds}, after {fds}")
    assert after.get("CLOSE_WAIT", 0) == 0, after
    assert after.get("ESTABLISHED", 0) <= open_before, after
    assert fds <= baseline_fds + FD_SLACK, (baseline_fds, fds)

    recorded = stored_statuses(gateway, [request_id for request_id, _ in results])
    assert len(recorded) == STREAMS
    for (kind, read), (request_id, _) in zip(plan, results):
        expected = {"ok"} if read == "all" else {"ok", "client_disconnected"}  # it may have ended before the hang-up
        assert recorded[request_id] in expected, (kind, read, request_id, recorded[request_id])
    abandoned = [recorded[request_id] for (_, read), (request_id, _) in zip(plan, results) if read == "first"]
    print(f"abandoned streams recorded client_disconnected: {abandoned.count('client_disconnected')}, "
          f"ok (ended before the hang-up was seen): {abandoned.count('ok')}")
    assert abandoned.count("client_disconnected") > 0  # the gateway did see clients go


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_stream_never_read_is_closed_and_recorded(gateway: Gateway, upstream: str, step: Any, kind: str) -> None:
    step(message={"content": STORY}, chunk_delay=0.02)
    request_id, _ = stream(gateway, kind, read="none")
    counts = settled_sockets(gateway, upstream, allowed_open=CONCURRENCY)
    assert counts.get("CLOSE_WAIT", 0) == 0, counts
    assert statuses(gateway, [request_id])[request_id] in ("ok", "client_disconnected")


def _failing(gateway: Gateway, upstream: str, kind: str) -> None:
    """The stream the fake upstream was scripted to break: an error ends it (an error event, or an HTTP
    error when the upstream failed before the gateway's first event), the run records an error, and the
    gateway holds no socket to the upstream beyond what its pools keep."""
    request_id, data = stream(gateway, kind, status=None)
    assert data and is_error(data[-1]), (kind, data[-3:])
    assert statuses(gateway, [request_id])[request_id] == "error"
    counts = settled_sockets(gateway, upstream, allowed_open=CONCURRENCY)
    assert counts.get("CLOSE_WAIT", 0) == 0, counts
    assert counts.get("ESTABLISHED", 0) <= CONCURRENCY, counts


@pytest.mark.parametrize("kind", list(KINDS))
def test_upstream_failing_mid_stream(gateway: Gateway, upstream: str, step: Any, kind: str) -> None:
    step(message={"content": STORY}, break_stream_after=3)
    _failing(gateway, upstream, kind)


@pytest.mark.parametrize("kind", list(KINDS))
def test_upstream_timing_out_mid_stream(impatient_gateway: Gateway, upstream: str, step: Any, kind: str) -> None:
    step(message={"content": STORY}, chunk_delay=6)  # the first event at once, the next after 6 s
    _failing(impatient_gateway, upstream, kind)
