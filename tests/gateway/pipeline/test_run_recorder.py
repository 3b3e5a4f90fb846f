"""Every run ends in a recorded status, and a fault of ours costs the client no connection."""
from __future__ import annotations

import asyncio
import http.client
import json
import sqlite3
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Mapping

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from gateway.app import create_app
from gateway.errors import UpstreamTimeout
from gateway.pipeline.run_recorder import RunRecorder
from gateway.upstream.seam import Prices, UpstreamRequest
from policies.transcript import message_path
from storage.record_types import RunOutcome, RunStart
from storage.schema import ToolArtifact
from testkit.gateway import TENANT_KEY, RunningGateway, make_store, settings_for
from testkit.fake_upstream import FakeUpstream, ServerThread
from tests.gateway.pipeline.test_rehydration import compacted_invoice_id, invoice_conversation, rehydrate, send

USER = [{"role": "user", "content": "hello"}]


class FaultyUpstream:
    """An upstream client with a bug: it raises what no GatewayError describes."""

    async def warm_up(self) -> None:
        return None

    async def call(self, api: str, request: UpstreamRequest) -> dict[str, Any]:
        raise RuntimeError("boom in complete")

    async def stream(self, api: str, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        yield {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "fake",
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": "partial"}, "finish_reason": None}]}
        raise KeyError("boom in stream")

    def cost_usd(self, litellm_params: Mapping[str, Any], usage: Mapping[str, Any]) -> float | None:
        return None

    def prices(self, litellm_params: Mapping[str, Any]) -> Prices | None:
        return None


@pytest.fixture
def faulty(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    settings = settings_for(fake.api_base, storage_url, tmp_path)
    app = create_app(settings, upstream=FaultyUpstream())
    server = ServerThread(app).start()
    yield RunningGateway(url=server.url, settings=settings, app=app, fake=fake)
    server.stop()


def run_record(gateway: RunningGateway, request_id: str) -> dict:
    with gateway.client() as http:
        return http.get(f"/api/requests/{request_id}").json()


def test_an_internal_error_is_recorded_answered_500_and_keeps_the_connection(faulty: RunningGateway) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", int(faulty.url.rsplit(":", 1)[1]), timeout=30)
    headers = {"Authorization": f"Bearer {TENANT_KEY}", "Content-Type": "application/json"}
    connection.request("POST", "/v1/chat/completions", json.dumps({"model": "fake", "messages": USER}), headers)
    response = connection.getresponse()
    body = json.loads(response.read())
    socket = connection.sock
    assert response.status == 500 and not response.will_close
    assert body == {"error": {"message": body["error"]["message"], "type": "api_error", "param": None,
                              "code": "internal_error"}}
    request_id = response.getheader("x-gateway-request-id")
    for _ in range(3):  # the same keep-alive connection goes on serving
        connection.request("GET", f"/api/requests/{request_id}", headers=headers)
        again = connection.getresponse()
        record = json.loads(again.read())
        assert again.status == 200 and connection.sock is socket
    assert record["status"] == "internal_error"
    assert record["error"] == {"type": "internal_error", "message": "RuntimeError: boom in complete"}
    assert record["assembly"] is not None  # the projection it was given is on record too
    assert body["error"]["message"].endswith("the request was recorded and can be retried.")
    connection.close()


def test_an_internal_error_says_the_run_was_not_recorded_when_it_was_not(faulty: RunningGateway,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def store_down(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the store failed")

    store = faulty.store
    with faulty.client() as http:
        monkeypatch.setattr(store, "finish_run", store_down)  # opened, but its outcome is never written
        unfinished = http.post("/v1/chat/completions", json={"model": "fake", "messages": USER})
        streamed = http.post("/v1/chat/completions", json={"model": "fake", "messages": USER, "stream": True})
        monkeypatch.setattr(store, "ingest", store_down)  # not even opened
        unopened = http.post("/v1/chat/completions", json={"model": "fake", "messages": USER})
        monkeypatch.undo()
        pending = http.get(f"/api/requests/{unfinished.headers['x-gateway-request-id']}").json()
        absent = http.get(f"/api/requests/{unopened.headers['x-gateway-request-id']}")
    last_event = json.loads([line[6:] for line in streamed.text.split("\n") if line.startswith("data: ")][-1])
    for message in (unfinished.json()["error"]["message"], last_event["error"]["message"]):
        assert message.endswith("the request's outcome was not recorded; it can be retried.")
    assert unopened.json()["error"]["message"].endswith("the request was not recorded and can be retried.")
    assert unfinished.status_code == unopened.status_code == 500
    assert pending["status"] == "pending" and absent.status_code == 404


def test_an_internal_error_mid_stream_is_an_error_event_and_a_recorded_run(faulty: RunningGateway) -> None:
    with faulty.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": USER, "stream": True})
        events = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
        assert response.status_code == 200
        assert json.loads(events[0])["choices"][0]["delta"]["content"] == "partial"
        assert json.loads(events[-1])["error"]["code"] == "internal_error"
        assert "[DONE]" not in events
        record = http.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()
    assert record["status"] == "internal_error" and record["error"]["message"].startswith("KeyError")


def test_a_corrupted_artifact_is_refused_to_the_model_not_a_stuck_run(rehydration_gateway: RunningGateway) -> None:
    gateway = rehydration_gateway
    messages = invoice_conversation()
    artifact_id = compacted_invoice_id(gateway, messages)
    with Session(gateway.store.engine) as session, session.begin():
        session.execute(update(ToolArtifact).where(ToolArtifact.id == artifact_id).values(content=b"tampered"))
    messages += [{"role": "assistant", "content": "noted"}, {"role": "user", "content": "The exact total?"}]
    gateway.fake.reset()
    gateway.fake.script_message(rehydrate(artifact_id))
    gateway.fake.script_message({"role": "assistant", "content": "I cannot read it."})
    record = send(gateway, messages)
    assert record["status"] == "ok"
    answer = gateway.fake.requests[1]["body"]["messages"][-1]["content"]
    assert "failed its integrity check" in answer
    refused = next(d for d in record["assembly"]["decisions"] if d["action"] == "rehydration_refused")
    assert refused["reason"] == "artifact_corrupted"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _start(clock: Clock) -> RunStart:
    return RunStart(request_id=f"req_{uuid.uuid4().hex}", tenant="acme", participant="p", model="fake",
                    upstream_model="openai/fake", stream=False,
                    started_at=datetime.fromtimestamp(clock.now, timezone.utc))


def test_runs_a_dead_instance_left_pending_are_settled(storage_url: str, tmp_path: Path) -> None:
    clock = Clock()
    dead = make_store(storage_url, tmp_path / "blobs")
    dead.clock = clock
    dead.register_instance()
    orphan = _start(clock)
    dead.ingest(message_path("acme", USER), orphan)
    live = make_store(storage_url, tmp_path / "blobs")
    live.clock = clock
    live.register_instance()
    serving = _start(clock)
    live.ingest(message_path("acme", [{"role": "user", "content": "still running"}]), serving)
    clock.now += 20
    live.heartbeat()
    assert live.settle_interrupted_runs(dead_after_seconds=30, unknown_after_seconds=600) == 0  # 20 s: alive
    clock.now += 20
    live.heartbeat()
    assert live.settle_interrupted_runs(dead_after_seconds=30, unknown_after_seconds=600) == 1
    assert dead.get_run(orphan.request_id, "acme").run["status"] == "interrupted"
    assert live.get_run(serving.request_id, "acme").run["status"] == "pending"  # its instance beats
    # A real outcome that arrives after all still wins over the guess.
    live.finish_run(orphan.request_id, RunOutcome(status="ok", latency_ms=1.0, http_status=200))
    assert live.get_run(orphan.request_id, "acme").run["status"] == "ok"
    assert live.retire_instance() == 1  # a clean shutdown settles what it still had
    assert live.get_run(serving.request_id, "acme").run["status"] == "interrupted"
    dead.engine.dispose()
    live.engine.dispose()


def test_a_run_without_an_instance_is_settled_past_the_upstream_timeout(sqlite_url: str, tmp_path: Path) -> None:
    clock = Clock()
    store = make_store(sqlite_url, tmp_path / "blobs")
    store.clock = clock
    legacy = _start(clock)
    store.ingest(message_path("acme", USER), legacy)  # no instance registered: as before migration 0004
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as db:
        assert db.execute("select instance_id from model_runs").fetchone() == (None,)
    store.register_instance()
    assert store.settle_interrupted_runs(dead_after_seconds=30, unknown_after_seconds=600) == 0
    clock.now += 10**6
    store.heartbeat()
    assert store.settle_interrupted_runs(dead_after_seconds=30, unknown_after_seconds=600) == 1
    store.engine.dispose()


class _Outcomes:
    """A store that keeps the outcomes it is given."""

    def __init__(self) -> None:
        self.outcomes: list[RunOutcome] = []

    def finish_run(self, request_id: str, outcome: RunOutcome, assembly: Any = None) -> bool:
        self.outcomes.append(outcome)
        return True


@pytest.mark.parametrize("exc, streaming, status, error_type", [
    (None, True, "client_disconnected", "client_disconnected"),
    (ConnectionResetError("send failed"), True, "client_disconnected", "client_disconnected"),
    (FileNotFoundError("blob gone"), False, "internal_error", "internal_error"),  # an OSError of ours, not a hang-up
    (asyncio.CancelledError(), False, "interrupted", "interrupted"),
    (ValueError("bug"), True, "internal_error", "internal_error"),
    (UpstreamTimeout("slow"), False, "error", "upstream_timeout"),
])
async def test_every_exit_maps_to_one_recorded_status(exc: BaseException | None, streaming: bool, status: str,
                                                      error_type: str) -> None:
    from gateway.ops.metrics import GatewayMetrics

    store = _Outcomes()
    recorder = RunRecorder(store, GatewayMetrics(), _start(Clock()), {"type": "http"})  # type: ignore[arg-type]
    recorder.opened = True
    await recorder.end_for(exc, streaming=streaming)
    await recorder.end_for(ValueError("a second exit"))  # recorded once only
    [outcome] = store.outcomes
    assert (outcome.status, outcome.error_type) == (status, error_type)


def _with_broken_store(gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch, method: str) -> tuple[Any, Any]:
    """A model request while the store's `method` raises: (the answer, the run's record as the API reads it)."""
    def broken(*args: Any) -> Any:
        raise RuntimeError(f"{method} failed")

    monkeypatch.setattr(gateway.store, method, broken)
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": USER})
        monkeypatch.undo()
        return response, http.get(f"/api/requests/{response.headers['x-gateway-request-id']}")


def test_a_failure_after_the_capture_committed_leaves_the_run_a_final_status(
        gateway_any_store: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27: the capture commits the run (pending), then what it reads for the assembly fails: the
    run is recorded `internal_error`, and the answer says it was recorded. On SQLite those reads follow
    the commit; on PostgreSQL they go to the server with the capture's last batch and its COMMIT
    (storage/store_base.py, folded transactions), so there too the run is stored when they are read."""
    gateway = gateway_any_store
    response, record = _with_broken_store(gateway, monkeypatch, "_read_after_capture")
    assert response.status_code == 500 and response.json()["error"] == {
        "message": "The gateway hit an internal error; the request was recorded and can be retried.",
        "type": "api_error", "param": None, "code": "internal_error"}
    assert record.status_code == 200 and record.json()["status"] == "internal_error"
    assert record.json()["error"] == {"type": "internal_error", "message": "CapturedThenFailed: after the capture:"
                                      " RuntimeError: _read_after_capture failed"}
    assert gateway.fake.requests == []  # nothing was forwarded


def test_a_capture_that_fails_before_its_commit_is_not_claimed_recorded(
        gateway_any_store: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """The capture's transaction rolled back: no run is stored, and the answer does not say one was."""
    response, record = _with_broken_store(gateway_any_store, monkeypatch, "_ingest")
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "The gateway hit an internal error; the request was not recorded and can be retried."
    assert record.status_code == 404
