"""Encryption at rest covers everything a conversation stores (issue 27), on SQLite and PostgreSQL.

A marker sent in a user message, in a tool call's arguments, in Responses input, and given back by
the upstream in an answer and in an error message is found nowhere on disk (the SQLite file, its
-wal and -shm, the blob folder, every file the test's folder holds; every text, binary and JSON
column of PostgreSQL), before a checkpoint and after, while every reader (the records API, the
projection, artifacts, the dashboard, Responses GET and `previous_response_id`) gives back exactly
what was sent. Without a key the same search finds each marker, so it looks in the right places;
`gateway encryption rotate` then seals what was stored in the clear, and moves everything to a new key.
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest
import sqlalchemy
import yaml

from gateway.cli import main
from gateway.config import load_settings
from policies.transcript import arguments_artifact_id, artifact_id_for, message_path
from storage.encryption import key_id
from testkit.gateway import TENANT_KEY, RunningGateway, start_gateway
from testkit.fake_upstream import FakeUpstream
from tests.gateway.dashboard.test_dashboard_escaping import signed_in
from tests.gateway.pipeline.test_encryption_at_rest import (  # noqa: F401 (a fixture)
    KEYS,
    Serving,
    key_environment,
    stored_bytes,
    write_config,
)
from tests.gateway.pipeline.test_rehydration import TOOLS, call, result

STEM = b"QX7SEALED"
MARKS = {place: f"{STEM.decode()}-{place}-5e1f" for place in ("user", "arguments", "answer", "error", "input", "output")}
CONVERSATION = [{"role": "system", "content": "You are a finance agent."},
                {"role": "user", "content": f"Look up {MARKS['user']}."},
                call("c1", "fetch_invoice", q=MARKS["arguments"]), result("c1", "invoice 7: paid")]


pytestmark = pytest.mark.usefixtures("key_environment")


@pytest.fixture
def serving(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[Serving]:
    running = Serving(fake, storage_url, tmp_path)
    yield running
    running.stop()


def serve(serving: Serving, current: str | None, *older: str) -> RunningGateway:
    """`serving.start`, or with `current` None a gateway without `storage.encryption_key`."""
    if current is not None:
        return serving.start(current, *older)
    serving.stop()
    serving.config = write_config(serving.folder, serving.fake.api_base, serving.storage_url, "A", *older)
    config = yaml.safe_load(serving.config.read_text())
    del config["storage"]["encryption_key"]
    serving.config.write_text(yaml.safe_dump(config))
    gateway, serving.server = start_gateway(load_settings(serving.config), serving.fake)
    return gateway


@dataclass
class Sent:
    """What the scenario sent and was answered, which every later read must give back exactly."""

    answered: dict[str, Any] = field(default_factory=dict)  # request id -> the client's JSON answer
    projected: dict[str, list[dict]] = field(default_factory=dict)  # request id -> its projection (all verbatim)
    failed: dict[str, str] = field(default_factory=dict)  # request id -> the error message the client got
    arguments: dict[str, str] = field(default_factory=dict)  # artifact id -> raw arguments
    responses: dict[str, dict] = field(default_factory=dict)  # response id -> the Responses JSON answer


def converse(gateway: RunningGateway) -> Sent:
    """A chat answered with a marker, a chat the upstream refuses with one, a Responses chain."""
    sent = Sent()
    fake = gateway.fake
    fake.reset()
    fake.script_message({"role": "assistant", "content": f"It is {MARKS['answer']}."})
    fake.script(status=400, error={"message": f"upstream refused: {MARKS['error']}", "type": "invalid_request_error",
                                   "param": None, "code": "refused"})
    fake.script_message({"role": "assistant", "content": f"Noted {MARKS['output']}."})
    fake.script_message({"role": "assistant", "content": "Still noted."})
    with gateway.client() as http:
        first = http.post("/v1/chat/completions", json={"model": "fake", "messages": CONVERSATION, "tools": TOOLS})
        assert first.status_code == 200, first.text
        request_id = first.headers["x-gateway-request-id"]
        sent.answered[request_id] = first.json()
        sent.projected[request_id] = CONVERSATION
        more = [*CONVERSATION, first.json()["choices"][0]["message"], {"role": "user", "content": MARKS["user"]}]
        refused = http.post("/v1/chat/completions", json={"model": "fake", "messages": more, "tools": TOOLS})
        assert refused.status_code == 400 and MARKS["error"] in refused.json()["error"]["message"], refused.text
        sent.failed[refused.headers["x-gateway-request-id"]] = refused.json()["error"]["message"]
        response = http.post("/v1/responses", json={"model": "fake", "input": [
            {"role": "user", "content": f"Remember {MARKS['input']}."}]})
        assert response.status_code == 200, response.text
        sent.responses[response.json()["id"]] = response.json()
        following = http.post("/v1/responses", json={"model": "fake", "input": "And now?",
                                                     "previous_response_id": response.json()["id"]})
        assert following.status_code == 200, following.text
    continued = json.dumps(fake.last_body()["input"])
    assert MARKS["input"] in continued and MARKS["output"] in continued  # the stored transcript, read back
    assistant = message_path("acme", CONVERSATION)[2].id
    sent.arguments[arguments_artifact_id(assistant, "c1")] = json.dumps({"q": MARKS["arguments"]})
    sent.arguments[artifact_id_for(message_path("acme", CONVERSATION)[3].id)] = json.dumps({"q": MARKS["arguments"]})
    return sent


def assert_read_back(gateway: RunningGateway, sent: Sent) -> None:
    with gateway.client() as http:
        for request_id, answer in sent.answered.items():
            record = http.get(f"/api/requests/{request_id}").json()
            assert record["response"] == answer
            projection = http.get(f"/api/requests/{request_id}/projection").json()["messages"]
            assert projection == sent.projected[request_id]
        for request_id, message in sent.failed.items():
            record = http.get(f"/api/requests/{request_id}").json()
            assert record["status"] == "error" and record["error"]["message"] == message
        for artifact_id, arguments in sent.arguments.items():
            if artifact_id.startswith("args_"):
                assert http.get(f"/api/artifacts/{artifact_id}").content == arguments.encode()
            else:
                assert http.get(f"/api/artifacts/{artifact_id}/metadata").json()["arguments"] == arguments
        for response_id, response in sent.responses.items():
            assert http.get(f"/v1/responses/{response_id}").json() == response
    with signed_in(gateway, TENANT_KEY) as client:
        page = client.get(f"/dashboard/requests/{next(iter(sent.answered))}").text
    assert MARKS["user"] in page and MARKS["arguments"] in page


def on_disk(folder: Path, storage_url: str) -> list[tuple[str, bytes]]:
    """Every file under the test's folder (the SQLite file, -wal, -shm, blobs...) and, for PostgreSQL,
    every text, binary and JSON value of the schema."""
    found = [(str(p), p.read_bytes()) for p in folder.rglob("*") if p.is_file()]
    if not storage_url.startswith("sqlite"):
        found += [("postgresql", value) for value in stored_bytes(storage_url)]
    return found


def checkpoint(storage_url: str) -> None:
    if storage_url.startswith("sqlite:///"):
        with sqlite3.connect(storage_url[len("sqlite:///"):]) as connection:
            busy, _, _ = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0


def assert_nowhere(folder: Path, storage_url: str) -> None:
    for moment in ("before a checkpoint", "after"):
        files = on_disk(folder, storage_url)
        assert any(name.endswith("gateway.db") for name, _ in files) or not storage_url.startswith("sqlite")
        leaks = [name for name, data in files if STEM in data]
        assert leaks == [], f"{moment}: {leaks}"
        checkpoint(storage_url)


def key_ids(storage_url: str) -> set[str | None]:
    engine = sqlalchemy.create_engine(storage_url)
    with engine.connect() as connection:
        found = set(connection.execute(sqlalchemy.text(" UNION ".join(
            f"SELECT key_id FROM {table}" for table in ("message_nodes", "tool_calls", "model_runs")))).scalars())
        found |= set(connection.execute(sqlalchemy.text(
            "SELECT key_id FROM tool_artifacts UNION SELECT key_id FROM forwarded_messages"
            " UNION SELECT key_id FROM blobs")).scalars())
    engine.dispose()
    return found


def test_a_conversation_leaves_no_plaintext_and_reads_back_exactly(serving: Serving, storage_url: str,
                                                                   tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    gateway = serve(serving, "A")
    sent = converse(gateway)
    assert_read_back(gateway, sent)
    assert_nowhere(tmp_path, storage_url)

    # A new key, the old one still read; rotation; then the old key goes and everything still reads.
    serve(serving, "B", "A")
    assert main(["encryption", "rotate", "--config", str(serving.config), "--batch", "2"]) == 0
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counts["unreadable"] == 0
    assert all(counts["resealed"][table] > 0 for table in ("message_nodes", "tool_calls", "model_runs"))
    gateway = serve(serving, "B")
    assert_read_back(gateway, sent)
    assert key_ids(storage_url) == {key_id(KEYS["B"])}
    assert_nowhere(tmp_path, storage_url)


def test_what_was_stored_in_the_clear_still_reads_and_rotation_seals_it(serving: Serving, storage_url: str,
                                                                         tmp_path: Path) -> None:
    gateway = serve(serving, None)
    sent = converse(gateway)
    files = on_disk(tmp_path, storage_url)
    for mark in MARKS.values():  # the search finds each marker where nothing seals it
        assert any(mark.encode() in data for _, data in files), mark
    gateway = serve(serving, "A")
    assert_read_back(gateway, sent)  # in the clear, read beside what is sealed from now on
    more = converse(gateway)
    assert_read_back(gateway, more)
    assert main(["encryption", "rotate", "--config", str(serving.config)]) == 0
    gateway = serve(serving, "A")
    assert_read_back(gateway, sent)
    assert key_ids(storage_url) == {key_id(KEYS["A"])}
    if storage_url.startswith("sqlite:///"):
        serving.stop()
        with sqlite3.connect(storage_url[len("sqlite:///"):]) as connection:
            connection.execute("VACUUM")  # freed pages keep the old text until then (README)
    assert_nowhere(tmp_path, storage_url)
