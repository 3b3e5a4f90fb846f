"""Encryption at rest through the running gateway (issue 14), on SQLite and PostgreSQL.

A tool result carrying a marker is captured (one small enough to stay in its
row, one large enough for a blob, and the memory the policy forwards of it);
the marker is then nowhere in the database or the blob folder, while
/api/artifacts, rehydration and the next request's projection give the exact
bytes. `gateway encryption rotate` moves everything to a new key while a gateway
serves, after which the old key can go.
"""
from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest
import sqlalchemy
import yaml

from gateway.cli import main
from gateway.config import ConfigError, load_settings, parse_settings
from storage.encryption import key_id
from testkit.gateway import TENANT_KEY, RunningGateway, start_gateway
from testkit.fake_upstream import FakeUpstream
from tests.gateway.pipeline.test_rehydration import FILLER, POLICY, TOOLS, call, rehydrate, result

MARKER = "MARKER-c0ffee-acct-4242"
INVOICE = f"invoice INV-7 for {MARKER}\n{FILLER}\nTOTAL DUE: 48,213.77 EUR (exact)\n{FILLER}\nend of invoice"
LEDGER = f"ledger ok; holder {MARKER}"
KEYS = {name: os.urandom(32) for name in ("A", "B", "C")}


@pytest.fixture(autouse=True)
def key_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, key in KEYS.items():
        monkeypatch.setenv(f"GW_TEST_KEY_{name}", base64.b64encode(key).decode())


def write_config(folder: Path, api_base: str, storage_url: str, current: str, *older: str) -> Path:
    (folder / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    storage = {"url": storage_url, "blob_dir": str(folder / "blobs"), "inline_max_bytes": 2048,
               "encryption_key": f"os.environ/GW_TEST_KEY_{current}",
               "decryption_keys": [f"os.environ/GW_TEST_KEY_{name}" for name in older]}
    config = {"models": [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": api_base,
                                                              "api_key": "sk-upstream"}}],
              "tenants": [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "policy.yaml"}],
              "storage": storage}
    path = folder / f"gateway-{current}{''.join(older)}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Serving:
    """One gateway at a time over the test's database and blob folder, under a chosen key set."""

    def __init__(self, fake: FakeUpstream, storage_url: str, folder: Path) -> None:
        self.fake, self.storage_url, self.folder = fake, storage_url, folder
        self.server: Any = None

    def start(self, current: str, *older: str) -> RunningGateway:
        self.stop()
        self.config = write_config(self.folder, self.fake.api_base, self.storage_url, current, *older)
        gateway, self.server = start_gateway(load_settings(self.config), self.fake)
        return gateway

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture
def serving(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[Serving]:
    running = Serving(fake, storage_url, tmp_path)
    yield running
    running.stop()


def send(gateway: RunningGateway, messages: list[dict]) -> dict:
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": messages, "tools": TOOLS})
        assert response.status_code == 200, response.text
        return http.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()


def artifact(gateway: RunningGateway, artifact_id: str) -> Any:
    with gateway.client() as http:
        return http.get(f"/api/artifacts/{artifact_id}")


def stored_bytes(storage_url: str) -> list[bytes]:
    """The database as a dump holds it: SQLite's file and log; every text and binary column of PostgreSQL."""
    if storage_url.startswith("sqlite:///"):
        file = Path(storage_url[len("sqlite:///"):])
        return [p.read_bytes() for p in (file, Path(f"{file}-wal")) if p.exists()]
    engine = sqlalchemy.create_engine(storage_url)
    values: list[bytes] = []
    with engine.connect() as connection:
        columns = connection.execute(sqlalchemy.text(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND data_type IN ('text', 'bytea', 'character varying', 'json', 'jsonb')")).all()
        assert {table for table, _ in columns} >= {"tool_artifacts", "blobs", "forwarded_messages", "message_nodes"}
        for table, column in columns:
            for value, in connection.execute(sqlalchemy.text(f'SELECT "{column}" FROM "{table}"')):
                if value is not None:
                    values.append(bytes(value) if isinstance(value, (bytes, memoryview)) else str(value).encode())
    engine.dispose()
    return values


def blob_files(folder: Path) -> list[bytes]:
    return [p.read_bytes() for p in (folder / "blobs").rglob("*") if p.is_file()]


def conversation() -> list[dict]:
    return [{"role": "system", "content": "You are a finance agent."},
            {"role": "user", "content": "Load invoice 7."}, call("c1", "fetch_invoice", id=7),
            result("c1", INVOICE), call("c2", "read_ledger", month="10"), result("c2", LEDGER)]


def test_no_plaintext_at_rest_exact_bytes_served_and_rotation(serving: Serving, storage_url: str,
                                                               tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    gateway = serving.start("A")
    messages = conversation()
    gateway.fake.script_message({"role": "assistant", "content": "noted"})
    first = send(gateway, messages)
    invoice_id = next(d["artifact_id"] for d in first["assembly"]["decisions"] if d["index"] == 3)
    ledger_id, = set(first["captured_artifact_ids"]) - {invoice_id}
    forwarded = gateway.fake.last_body()["messages"]
    assert MARKER in forwarded[3]["content"] and forwarded[3]["content"] != INVOICE  # a memory of it
    assert forwarded[5]["content"] == LEDGER
    assert artifact(gateway, invoice_id).content == INVOICE.encode()
    assert artifact(gateway, ledger_id).content == LEDGER.encode()

    # The model rehydrates the invoice on the next request, which forwards the same memory again.
    messages += [{"role": "assistant", "content": "noted"}, {"role": "user", "content": "The exact total?"}]
    gateway.fake.reset()
    gateway.fake.script_message(rehydrate(invoice_id))
    gateway.fake.script_message({"role": "assistant", "content": "48,213.77 EUR"})
    second = send(gateway, messages)
    asked, answered = [r["body"]["messages"] for r in gateway.fake.requests]
    assert asked[:6] == forwarded
    assert answered[-1] == {"role": "tool", "tool_call_id": "gw_1", "content": INVOICE}

    # Nowhere at rest: database (every table), blob folder.
    assert not any(MARKER.encode() in value for value in stored_bytes(storage_url))
    blobs = blob_files(tmp_path)
    assert blobs and not any(MARKER.encode() in blob for blob in blobs)
    engine = sqlalchemy.create_engine(storage_url)
    with engine.connect() as connection:
        sealed = connection.execute(sqlalchemy.text("SELECT key_id FROM forwarded_messages")).scalars().all()
    assert sealed and set(sealed) == {key_id(KEYS["A"])}

    # A new key, the old one still read; a request captured under it; rotation while serving.
    gateway = serving.start("B", "A")
    messages += [{"role": "assistant", "content": "48,213.77 EUR"}, {"role": "user", "content": "And the ledger?"},
                 call("c3", "read_ledger", month="11"), result("c3", f"november {MARKER}")]
    gateway.fake.reset()
    gateway.fake.script_message({"role": "assistant", "content": "fine"})
    third = send(gateway, messages)
    assert main(["encryption", "rotate", "--config", str(serving.config), "--batch", "1"]) == 0
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counts["key_id"] == key_id(KEYS["B"]) and counts["unreadable"] == 0
    # Key A's two artifact rows (the ledger's inline content, and both calls' arguments) and one blob file.
    assert counts["resealed"]["tool_artifacts"] == 2 and counts["resealed"]["blobs"] == 1
    assert counts["resealed"]["forwarded_messages"] >= 1

    # The old key removed: everything still reads.
    gateway = serving.start("B")
    for artifact_id, content in ((invoice_id, INVOICE), (ledger_id, LEDGER),
                                 (third["captured_artifact_ids"][0], f"november {MARKER}")):
        assert artifact(gateway, artifact_id).content == content.encode()
    with gateway.client() as http:
        projection = http.get(f"/api/requests/{first['id']}/projection").json()["messages"]
    assert projection[3]["content"] == forwarded[3]["content"]
    gateway.fake.reset()
    gateway.fake.script_message(rehydrate(invoice_id, "gw_2"))
    gateway.fake.script_message({"role": "assistant", "content": "48,213.77 EUR"})
    send(gateway, messages[:8])
    assert gateway.fake.requests[1]["body"]["messages"][-1]["content"] == INVOICE
    with engine.connect() as connection:
        left = connection.execute(sqlalchemy.text(
            "SELECT key_id FROM tool_artifacts WHERE key_id IS NOT NULL UNION SELECT key_id FROM blobs"
            " UNION SELECT key_id FROM forwarded_messages")).scalars().all()
    assert left == [key_id(KEYS["B"])]
    assert second["status"] == "ok"

    # A changed byte in a sealed row reads as corrupted; a gateway without the key says which key it lacks.
    with engine.begin() as connection:
        stored = connection.execute(sqlalchemy.text("SELECT content FROM tool_artifacts WHERE id = :id"),
                                    {"id": ledger_id}).scalar_one()
        stored = bytes(stored)
        connection.execute(sqlalchemy.text("UPDATE tool_artifacts SET content = :c WHERE id = :id"),
                           {"c": stored[:-1] + bytes([stored[-1] ^ 1]), "id": ledger_id})
    engine.dispose()
    response = artifact(gateway, ledger_id)
    assert response.status_code == 500 and response.json()["error"]["code"] == "artifact_corrupted"
    gateway = serving.start("C")
    response = artifact(gateway, invoice_id)
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "encryption_key_unavailable" and key_id(KEYS["B"]) in error["message"]
    assert base64.b64encode(KEYS["B"]).decode() not in response.text
    with gateway.client() as http:
        response = http.get(f"/api/requests/{first['id']}/projection")  # its memory is sealed too
    assert response.status_code == 500 and response.json()["error"]["code"] == "encryption_key_unavailable"
    gateway.fake.reset()
    gateway.fake.script_message(rehydrate(invoice_id, "gw_3"))
    gateway.fake.script_message({"role": "assistant", "content": "cannot tell"})
    refused = send(gateway, messages[:8])
    assert "cannot be read" in gateway.fake.requests[1]["body"]["messages"][-1]["content"]
    assert any(d["action"] == "rehydration_refused" and d["reason"] == "encryption_key_unavailable"
               for d in refused["assembly"]["decisions"])


@pytest.mark.parametrize(("storage", "field"), [
    ({"encryption_key": "not base64!"}, "storage.encryption_key"),
    ({"encryption_key": base64.b64encode(b"k" * 16).decode()}, "storage.encryption_key"),
    ({"encryption_key": base64.b64encode(b"k" * 32).decode(),
      "decryption_keys": [base64.b64encode(b"o" * 32).decode(), "c2hvcnQ="]}, "storage.decryption_keys[1]"),
])
def test_a_malformed_key_is_refused_by_field_without_being_echoed(storage: dict, field: str) -> None:
    raw = {"models": [{"name": "m", "litellm_params": {"model": "openai/m"}}],
           "tenants": [{"id": "acme", "api_keys": ["k"]}], "storage": storage}
    with pytest.raises(ConfigError) as refused:
        parse_settings(raw, "gateway.yaml")
    assert refused.value.field == field
    bad = storage.get("decryption_keys", [storage["encryption_key"]])[-1]
    assert bad not in str(refused.value)
    assert "32 bytes" in str(refused.value) or "base64" in str(refused.value)


def test_keys_rotate_needs_a_key(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "m", "litellm_params": {"model": "openai/m"}}],
                                    "tenants": [{"id": "acme", "api_keys": ["k"]}],
                                    "storage": {"url": f"sqlite:///{tmp_path / 'g.db'}"}}))
    assert main(["keys", "rotate", "--config", str(path)]) == 2  # the older name, still accepted
    assert "storage.encryption_key" in capsys.readouterr().err
