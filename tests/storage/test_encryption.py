"""Encryption at rest (issue 14): envelopes, sealed capture and reads, rotation, on SQLite and PostgreSQL."""
from __future__ import annotations

import json
import os
import threading
import uuid
import zlib
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import select, text, update

from policies.transcript import artifact_id_for, message_path, tool_call_pk
from storage.assembly_record import AssemblyRecord
from storage.blobs import BlobCorrupted, DirectoryBlobStore
from storage.database import make_engine
from storage.encryption import (
    MAGIC,
    TEXT_MAGIC,
    EncryptionKeys,
    Tampered,
    UnknownKey,
    artifact_aad,
    call_arguments_aad,
    key_id,
    node_aad,
    sealed_key_id,
)
from storage.record_types import ArtifactCorrupted, RunOutcome, RunStart
from storage.records import RecordStore
from storage.schema import Blob, ContextAssembly, ToolArtifact

KEY_A, KEY_B, KEY_C = os.urandom(32), os.urandom(32), os.urandom(32)
MARKER = b"MARKER-7f3a9c-customer-secret"
INLINE_MAX = 1024


def conversation(small: str, large: str) -> list[dict]:
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}} for i in (1, 2)]
    return [{"role": "user", "content": "Read both."},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "c1", "content": small},
            {"role": "tool", "tool_call_id": "c2", "content": large}]


def contents(tag: str) -> tuple[str, str]:
    small = f"{tag}: {MARKER.decode()} inline"
    large = f"{tag}: {MARKER.decode()} in a blob\n" + "".join(f"row {i} of the report\n" for i in range(200))
    return small, large


def run(tenant: str = "acme") -> RunStart:
    return RunStart(request_id=f"req_{uuid.uuid4().hex}", tenant=tenant, participant="p", model="fake",
                    upstream_model="openai/fake", stream=False)


def open_store(url: str, blob_dir: Path, current: bytes | None, *older: bytes) -> RecordStore:
    store = RecordStore(make_engine(url), DirectoryBlobStore(blob_dir), inline_max_bytes=INLINE_MAX,
                        encryption=EncryptionKeys(current, older))
    store.create_schema()
    return store


@pytest.fixture
def stores(storage_url: str, tmp_path: Path) -> Iterator:
    opened: list[RecordStore] = []

    def make(current: bytes | None, *older: bytes) -> RecordStore:
        opened.append(open_store(storage_url, tmp_path / "blobs", current, *older))
        return opened[-1]

    yield make
    for store in opened:
        store.engine.dispose()


def capture(store: RecordStore, tag: str, tenant: str = "acme") -> tuple[list[str], tuple[str, str]]:
    small, large = contents(tag)
    path = message_path(tenant, conversation(small, large))
    store.ingest(path, run(tenant))
    return [artifact_id_for(path[2].id), artifact_id_for(path[3].id)], (small, large)


def read(store: RecordStore, artifact_id: str) -> bytes:
    record = store.get_artifact(artifact_id, None)
    assert record is not None
    return store.artifact_bytes(record)


def stored_values(store: RecordStore) -> list[bytes]:
    """Every text and binary value of every table, as a dump would hold them."""
    values: list[bytes] = []
    with store.engine.connect() as connection:
        for table in ("message_nodes", "tool_artifacts", "tool_calls", "model_runs", "blobs",
                      "forwarded_messages", "context_assemblies"):
            for row in connection.execute(text(f"SELECT * FROM {table}")):
                values += [v if isinstance(v, bytes) else str(v).encode() for v in row if v is not None]
    return values


def files_under(folder: Path) -> list[bytes]:
    return [p.read_bytes() for p in folder.rglob("*") if p.is_file()]


def test_an_envelope_opens_only_with_its_key_and_where_it_belongs() -> None:
    keys = EncryptionKeys(KEY_A, [KEY_B])
    sealed = keys.seal(b"secret", artifact_aad("aa"))
    assert sealed.startswith(MAGIC) and sealed_key_id(sealed) == key_id(KEY_A) == keys.current_id
    assert b"secret" not in sealed
    assert keys.open(sealed, artifact_aad("aa")) == b"secret"
    assert keys.seal(b"secret", artifact_aad("aa")) != sealed  # a fresh nonce every time
    with pytest.raises(Tampered):
        keys.open(sealed, artifact_aad("bb"))  # moved to another artifact
    with pytest.raises(Tampered):
        keys.open(sealed[:-1] + bytes([sealed[-1] ^ 1]), artifact_aad("aa"))
    with pytest.raises(UnknownKey) as missing:
        EncryptionKeys(KEY_C).open(sealed, artifact_aad("aa"))
    assert missing.value.key_id == key_id(KEY_A)
    assert EncryptionKeys(KEY_B, [KEY_A]).open(sealed, artifact_aad("aa")) == b"secret"  # an older key reads
    assert keys.open(b"stored in the clear", artifact_aad("aa")) == b"stored in the clear"
    with pytest.raises(ValueError):
        EncryptionKeys(b"short")


def test_captured_content_is_sealed_inline_and_in_blobs(stores, tmp_path: Path) -> None:
    store = stores(KEY_A)
    ids, (small, large) = capture(store, "first")
    assert read(store, ids[0]) == small.encode() and read(store, ids[1]) == large.encode()
    assert not any(MARKER in value for value in stored_values(store))
    blobs = files_under(tmp_path / "blobs")
    assert len(blobs) == 1 and MARKER not in blobs[0] and sealed_key_id(blobs[0]) == key_id(KEY_A)
    with store.engine.connect() as connection:
        inline_key, = connection.execute(select(ToolArtifact.key_id).where(ToolArtifact.id == ids[0])).one()
        blob_key, = connection.execute(select(Blob.key_id)).one()
    assert inline_key == blob_key == key_id(KEY_A)
    messages = store.path_messages(message_path("acme", conversation(small, large))[-1].id)
    assert [m["content"] for m in messages[2:]] == [small, large]


def test_content_stored_before_the_key_still_reads_and_rotation_seals_it(stores, tmp_path: Path) -> None:
    clear = stores(None)
    old_ids, old = capture(clear, "before")
    shared_large = old[1]
    assert any(MARKER in blob for blob in files_under(tmp_path / "blobs"))  # what the checks below would see
    assert any(MARKER in value for value in stored_values(clear))
    sealed = stores(KEY_A)
    new_ids, new = capture(sealed, "after")
    assert [read(sealed, i) for i in old_ids + new_ids] == [v.encode() for v in old + new]
    # Another tenant captures the same large content: one file, now sealed under the current key.
    other_ids, _ = capture(sealed, "before", tenant="globex")
    assert read(sealed, other_ids[1]) == read(sealed, old_ids[1]) == shared_large.encode()
    report = sealed.rotate_keys(batch=1)
    assert report.unreadable == []
    # The clear rows: both artifacts (the inline one's content, and each one's arguments), the four
    # messages and the two calls; the runs ended nowhere, so they hold nothing to seal.
    tables = ("tool_artifacts", "message_nodes", "tool_calls", "model_runs")
    assert {table: report.resealed[table] for table in tables} == dict(zip(tables, (2, 4, 2, 0)))
    assert not any(MARKER in value for value in stored_values(sealed))
    assert not any(MARKER in blob for blob in files_under(tmp_path / "blobs"))
    assert [read(sealed, i) for i in old_ids + new_ids] == [v.encode() for v in old + new]


def test_rotation_lets_the_old_key_go(stores, tmp_path: Path) -> None:
    first = stores(KEY_A)
    ids, values = capture(first, "one")
    rotated = stores(KEY_B, KEY_A)
    more_ids, more = capture(rotated, "two")
    report = rotated.rotate_keys(batch=1)
    assert report.unreadable == []
    # Key A's rows: two artifacts (the inline one's content, and each one's arguments), the four
    # messages it captured first and their two calls; one blob file.
    assert report.resealed["tool_artifacts"] == 2 and report.resealed["blobs"] == 1
    assert report.resealed["message_nodes"] == 4 and report.resealed["tool_calls"] == 2
    assert rotated.rotate_keys().resealed == {"tool_artifacts": 0, "forwarded_messages": 0, "context_assemblies": 0,
                                              "message_nodes": 0, "tool_calls": 0, "model_runs": 0,
                                              "blobs": 0}  # nothing left
    only_new = stores(KEY_B)
    assert [read(only_new, i) for i in ids + more_ids] == [v.encode() for v in values + more]
    assert {sealed_key_id(b) for b in files_under(tmp_path / "blobs")} == {key_id(KEY_B)}
    with pytest.raises(UnknownKey):
        read(stores(KEY_A), ids[0])  # the old key alone no longer reads anything


def test_tampered_or_swapped_ciphertext_reads_as_corrupted(stores, tmp_path: Path) -> None:
    store = stores(KEY_A)
    ids, _ = capture(store, "x")
    other_ids, _ = capture(store, "y")
    table = ToolArtifact.__table__
    with store.engine.begin() as connection:
        theirs = connection.scalar(select(table.c.content).where(table.c.id == other_ids[0]))
        connection.execute(update(table).where(table.c.id == ids[0]).values(content=theirs))
        flipped = theirs[:-5] + bytes([theirs[-5] ^ 0x40]) + theirs[-4:]
        connection.execute(update(table).where(table.c.id == other_ids[0]).values(content=flipped))
    with pytest.raises(ArtifactCorrupted):
        read(store, ids[0])  # another artifact's envelope: its associated data does not match
    with pytest.raises(ArtifactCorrupted):
        read(store, other_ids[0])  # a changed byte
    blob = next(p for p in (tmp_path / "blobs").rglob("*") if p.is_file() and p.name == store.get_artifact(
        ids[1], None).blob_key)
    data = blob.read_bytes()
    blob.write_bytes(data[:40] + bytes([data[40] ^ 1]) + data[41:])
    with pytest.raises(BlobCorrupted):
        read(store, ids[1])


def test_a_missing_key_is_named_not_mistaken_for_corruption(stores) -> None:
    ids, _ = capture(stores(KEY_A), "z")
    wrong = stores(KEY_C)
    for artifact_id in ids:
        with pytest.raises(UnknownKey) as missing:
            read(wrong, artifact_id)
        assert missing.value.key_id == key_id(KEY_A)
    report = wrong.rotate_keys()
    # Two artifacts (one inline, one the blob file's), four messages and two calls: each named, with the key.
    assert sorted(line.split()[0] for line in report.unreadable) == [
        "blob", "message_nodes", "message_nodes", "message_nodes", "message_nodes", "tool_artifacts", "tool_artifacts",
        "tool_calls", "tool_calls"]
    assert all(key_id(KEY_A) in line for line in report.unreadable)


def test_rotation_while_captures_run_breaks_no_record(stores) -> None:
    before = stores(KEY_A)
    for i in range(20):
        capture(before, f"old {i}")
    serving = stores(KEY_B, KEY_A)
    captured: list[tuple[list[str], tuple[str, str]]] = []
    errors: list[BaseException] = []

    def keep_capturing() -> None:
        try:
            for i in range(20):
                captured.append(capture(serving, f"old {i}" if i % 2 else f"new {i}", tenant="globex"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    worker = threading.Thread(target=keep_capturing)
    worker.start()
    rotator = stores(KEY_B, KEY_A)
    report = rotator.rotate_keys(batch=3)
    worker.join(60)
    assert errors == [] and report.unreadable == []
    rotator.rotate_keys()  # what the captures sealed under B meanwhile needs nothing; the rest is finished
    only_new = stores(KEY_B)
    for ids, values in captured:
        assert [read(only_new, i) for i in ids] == [v.encode() for v in values]
    with only_new.engine.connect() as connection:
        left = connection.scalar(text("SELECT count(*) FROM tool_artifacts WHERE content IS NOT NULL "
                                      "AND (key_id IS NULL OR key_id != :k)"), {"k": key_id(KEY_B)})
    assert left == 0


def test_a_projection_stored_whole_before_0005_is_sealed_by_rotation(stores) -> None:
    store = stores(None)
    small, large = contents("old")
    path = message_path("acme", conversation(small, large))
    start = run()
    store.ingest(path, start)
    assembly = AssemblyRecord(policy_name="p", policy_version="1", assembler_version="1", tokens_original=1,
                              tokens_forwarded=1, messages_original=4, messages_forwarded=4, boundary_round=0,
                              epoch_round=0, omissions={}, timings_ms={})
    store.finish_run(start.request_id, RunOutcome(status="ok", latency_ms=1.0), assembly)
    projection = [{"role": "tool", "tool_call_id": "c1", "content": small}]
    with store.engine.begin() as connection:  # as revision 0004 stored projections
        connection.execute(update(ContextAssembly).values(forwarded_zlib=zlib.compress(json.dumps(projection).encode())))
    sealed = stores(KEY_A)
    assert sealed.rotate_keys().resealed["context_assemblies"] == 1
    with sealed.engine.connect() as connection:
        stored, stored_key = connection.execute(select(ContextAssembly.forwarded_zlib, ContextAssembly.key_id)).one()
    assert stored.startswith(MAGIC) and stored_key == key_id(KEY_A)
    assert sealed.forwarded_messages(start.request_id, "acme") == projection


def test_a_text_column_opens_only_in_a_sealed_row_and_where_it_belongs() -> None:
    keys = EncryptionKeys(KEY_A)
    value = '{"q": "caf\u00e9 \U0001f512 ' + MARKER.decode() + '"}'
    sealed = keys.seal_text(value, node_aad("n1"))
    assert sealed is not None and sealed.startswith(TEXT_MAGIC) and MARKER.decode() not in sealed
    assert keys.open_text(sealed, node_aad("n1"), keys.current_id) == value
    for elsewhere in (node_aad("n2"), call_arguments_aad("n1")):  # another row, another column
        with pytest.raises(Tampered):
            keys.open_text(sealed, elsewhere, keys.current_id)
    assert keys.open_text(sealed, node_aad("n1"), None) == sealed  # a row written in the clear: as it is
    with pytest.raises(Tampered):
        keys.open_text(TEXT_MAGIC + " is not base64", node_aad("n1"), keys.current_id)
    assert keys.seal_text(None, node_aad("n1")) is None
    assert EncryptionKeys().seal_text(value, node_aad("n1")) == value


def test_a_runs_answer_and_error_are_sealed_to_their_run(stores) -> None:
    store = stores(KEY_A)
    answer = {"choices": [{"message": {"role": "assistant", "content": f"it is {MARKER.decode()}"}}]}
    runs = []
    for outcome in (RunOutcome(status="ok", latency_ms=1.0, response=answer),
                    RunOutcome(status="error", latency_ms=1.0, error_type="upstream_error",
                               error_message=f"refused: {MARKER.decode()}")):
        start = run()
        store.ingest(message_path("acme", [{"role": "user", "content": MARKER.decode()}]), start)
        store.finish_run(start.request_id, outcome)
        runs.append(start.request_id)
    ok, failed = (store.get_run(request_id, "acme") for request_id in runs)
    assert ok is not None and ok.run["response"] == answer
    assert failed is not None
    assert failed.run["error"] == {"type": "upstream_error", "message": f"refused: {MARKER.decode()}"}
    assert not any(MARKER in value for value in stored_values(store))
    with store.engine.begin() as connection:  # one run's answer moved onto the other: it no longer opens
        moved = connection.scalar(text("SELECT response_json FROM model_runs WHERE id = :id"), {"id": runs[0]})
        connection.execute(text("UPDATE model_runs SET response_json = :r WHERE id = :id"), {"r": moved, "id": runs[1]})
    with pytest.raises(Tampered):
        store.get_run(runs[1], "acme")


def test_text_that_only_looks_sealed_and_arguments_left_in_the_clear_read_and_get_sealed(stores) -> None:
    looks_sealed = TEXT_MAGIC + "Q== is what a custom tool was given"
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "run", "arguments": looks_sealed}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"}]
    path = message_path("acme", messages)
    stores(None).ingest(path, run())
    sealed = stores(KEY_A)
    later = message_path("acme", [*messages, {"role": "user", "content": "again"}, *messages[1:]])
    sealed.ingest(later, run())
    artifact_ids = [artifact_id_for(path[2].id), artifact_id_for(later[-1].id)]
    with sealed.engine.begin() as connection:  # as versions before 0013 stored an artifact's arguments
        connection.execute(update(ToolArtifact).where(ToolArtifact.id == artifact_ids[1]).values(arguments="{}"))
    assert [sealed.get_artifact(i, "acme").arguments for i in artifact_ids] == [looks_sealed, "{}"]
    arguments_id = f"args_{tool_call_pk(path[1].id, 'c1')}"
    assert sealed.get_call_arguments(arguments_id, "acme")[0] == looks_sealed
    assert sealed.rotate_keys().resealed["tool_artifacts"] == 2  # the clear row, and the arguments beside a key
    with sealed.engine.connect() as connection:
        stored = connection.execute(select(ToolArtifact.arguments)).scalars().all()
        clear_calls = connection.scalar(text("SELECT count(*) FROM tool_calls WHERE key_id IS NULL"))
    assert len(stored) == 2 and all(value.startswith(TEXT_MAGIC) and value != looks_sealed for value in stored)
    assert clear_calls == 0
    only_a = stores(KEY_A)
    assert [only_a.get_artifact(i, "acme").arguments for i in artifact_ids] == [looks_sealed, "{}"]
    assert only_a.get_call_arguments(arguments_id, "acme")[0] == looks_sealed
