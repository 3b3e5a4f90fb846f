"""Blobs are shared by content across tenants: no delete may take one a capture relies on (each store in turn).

The race of issue 8: tenant A deletes a conversation whose large artifact has
content X while tenant B captures the same X. Before the blob registry, B's
`put` skipped writing because the file existed, A removed the file after its
commit, and B's artifact answered `artifact_corrupted`.
"""
from __future__ import annotations

import hashlib
import os
import random
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from policies.transcript import artifact_id_for, message_path
from storage.blobs import BlobStore, BlobStoreUnavailable, DirectoryBlobStore
from storage.database import make_engine
from storage.encryption import NO_ENCRYPTION, EncryptionKeys
from storage.record_types import RunStart
from storage.records import RecordStore

FILLER = "".join(f"line {i}: the build printed something long enough to leave the row\n" for i in range(40))


def conversation(content: str) -> list[dict]:
    return [{"role": "user", "content": "Build it."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "build", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": content}]


def run(tenant: str, label: str | None = None) -> RunStart:
    return RunStart(request_id=f"req_{uuid.uuid4().hex}", tenant=tenant, participant="p", model="fake",
                    upstream_model="openai/fake", stream=False, session_label=label)


class PausingBlobs:
    """A blob store (each kind in turn) that stops inside `put` (or, with encryption on, the `read`
    that checks the file), after the blob is in place and before the capture commits."""

    def __init__(self, inner: BlobStore) -> None:
        self.inner = inner
        self.pause = False
        self.inside = threading.Event()
        self.go_on = threading.Event()

    def _stop_here(self) -> None:
        if self.pause:
            self.inside.set()
            assert self.go_on.wait(30)

    def put(self, data: bytes) -> str:
        key = self.inner.put(data)
        self._stop_here()
        return key

    def read(self, key: str) -> bytes:
        data = self.inner.read(key)
        self._stop_here()
        return data

    def write(self, key: str, data: bytes) -> None:
        self.inner.write(key, data)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def delete(self, key: str) -> int:
        return self.inner.delete(key)

    def keys(self) -> Iterator[str]:
        return self.inner.keys()

    def check(self) -> None:
        self.inner.check()


@pytest.fixture(params=["directory", "directory-encrypted", "s3-encrypted"])
def store(request: pytest.FixtureRequest, storage_url: str, tmp_path: Path) -> Iterator[RecordStore]:
    """The store over a folder with blobs in the clear and sealed (storage/sealed_blobs.py), and
    over S3 sealed (the S3 store in the clear: tests/storage/test_s3_blobs.py)."""
    inner = request.getfixturevalue("s3_blobs") if request.param.startswith("s3") \
        else DirectoryBlobStore(tmp_path / "blobs")
    keys = EncryptionKeys(os.urandom(32)) if request.param.endswith("encrypted") else NO_ENCRYPTION
    store = RecordStore(make_engine(storage_url), PausingBlobs(inner), inline_max_bytes=1024, encryption=keys)
    store.create_schema()
    yield store
    store.engine.dispose()


def test_a_delete_waits_for_a_capture_that_relies_on_the_same_file(store: RecordStore) -> None:
    content = "the same output, captured by two tenants\n" + FILLER
    store.ingest(message_path("acme", conversation(content)), run("acme", "a-1"))
    blobs: PausingBlobs = store.blobs  # type: ignore[assignment]
    blobs.pause = True
    theirs = message_path("globex", conversation(content))
    capture = threading.Thread(target=store.ingest, args=(theirs, run("globex")))
    capture.start()
    assert blobs.inside.wait(30)  # globex's capture has found the file and holds its registry row
    blobs.pause = False
    deleted: dict = {}
    deletion = threading.Thread(target=lambda: deleted.update(store.delete_conversation("acme", "a-1")))
    deletion.start()
    deletion.join(0.5)
    blobs.go_on.set()  # globex commits; only then may the deletion decide about the file
    capture.join(30)
    deletion.join(30)
    assert deleted["tool_artifacts"] == 1 and deleted["blobs"] == 0
    record = store.get_artifact(artifact_id_for(theirs[-1].id), "globex")
    assert record is not None and store.artifact_bytes(record) == content.encode()


def test_deletes_racing_captures_of_the_same_content_lose_no_artifact(store: RecordStore) -> None:
    lost = []
    for i in range(200):
        content = f"iteration {i}\n" + FILLER
        store.ingest(message_path("acme", conversation(content)), run("acme", f"a-{i}"))
        theirs = message_path("globex", conversation(content))
        barrier = threading.Barrier(2)

        def delete() -> None:
            barrier.wait()
            store.delete_conversation("acme", f"a-{i}")

        def capture() -> None:
            barrier.wait()
            if random.random() < 0.5:
                threading.Event().wait(random.random() / 500)
            store.ingest(theirs, run("globex", f"g-{i}"))

        threads = [threading.Thread(target=delete), threading.Thread(target=capture)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        record = store.get_artifact(artifact_id_for(theirs[-1].id), "globex")
        try:
            if record is None or store.artifact_bytes(record) != content.encode():
                lost.append(i)
        except Exception:
            lost.append(i)
        store.delete_conversation("globex", f"g-{i}")  # and the file goes with the last artifact naming it
        assert list(store.blobs.keys()) == [], i
    assert lost == []


def test_put_rewrites_a_file_that_lost_its_bytes(tmp_path: Path) -> None:
    blobs = DirectoryBlobStore(tmp_path)
    data = b"x" * 5000
    key = blobs.put(data)
    path = next(p for p in tmp_path.rglob("*") if p.is_file())
    path.write_bytes(b"y" * 5000)  # same size, other bytes
    assert blobs.put(data) == key
    assert blobs.get(key) == data


def _pause_once(store: RecordStore, method: str, when: "callable | None" = None) -> tuple[threading.Event, threading.Event]:
    """Make `store.<method>` stop after it ran, the first time `when(args)` holds, until released."""
    reached, release = threading.Event(), threading.Event()
    original = getattr(store, method)

    def paused(*args, **kwargs):
        result = original(*args, **kwargs)
        if not reached.is_set() and (when is None or when(args)):
            reached.set()
            assert release.wait(30)
        return result

    setattr(store, method, paused)
    return reached, release


@pytest.mark.parametrize("pause_in", ["_known_nodes", "_join_conversation"])
def test_a_conversation_deleted_while_another_adopts_its_nodes_loses_neither(store: RecordStore,
                                                                             pause_in: str) -> None:
    """Conversation d starts with the same messages as c while c is deleted: whichever commits
    first, d ends whole (its capture starts over, or the deletion keeps what d now uses)."""
    content = "shared opening output\n" + FILLER
    store.ingest(message_path("acme", conversation(content)), run("acme", "c"))
    longer = conversation(content) + [{"role": "assistant", "content": "built"}, {"role": "user", "content": "more"}]
    theirs = message_path("acme", longer)
    reached, release = _pause_once(store, pause_in)
    capture = threading.Thread(target=store.ingest, args=(theirs, run("acme", "d")))
    capture.start()
    assert reached.wait(30)  # d has read what exists (or added itself to the nodes), uncommitted
    deleted: dict = {}
    deletion = threading.Thread(target=lambda: deleted.update(store.delete_conversation("acme", "c")))
    deletion.start()
    deletion.join(1.0)
    release.set()
    capture.join(30)
    deletion.join(30)
    assert not capture.is_alive() and not deletion.is_alive()
    assert deleted["model_runs"] == 1
    record = store.get_artifact(artifact_id_for(theirs[2].id), "acme")
    assert record is not None and store.artifact_bytes(record) == content.encode()
    assert store.delete_conversation("acme", "d")["message_nodes"] == 5  # all of d's path was d's alone


def test_both_stores_keep_one_contract(any_blob_store: BlobStore) -> None:
    """What capture, reads and collection rely on, the same from a folder and from a bucket."""
    any_blob_store.check()
    assert list(any_blob_store.keys()) == []
    data = b"large output\n" * 500
    key = any_blob_store.put(data)
    assert key == hashlib.sha256(data).hexdigest() and any_blob_store.put(data) == key
    assert any_blob_store.get(key) == data and list(any_blob_store.keys()) == [key]
    assert any_blob_store.delete(key) == 1 and any_blob_store.delete(key) == 0
    with pytest.raises(FileNotFoundError):
        any_blob_store.get(key)
    with pytest.raises(ValueError):
        any_blob_store.get("../" + key[3:])
    assert list(any_blob_store.keys()) == []


def test_directory_keys_skip_writes_in_flight(tmp_path: Path) -> None:
    blobs = DirectoryBlobStore(tmp_path)
    key = blobs.put(b"kept")
    (tmp_path / key[:2] / ".tmp-abc").write_bytes(b"half written")
    (tmp_path / "notes.txt").write_text("not a blob")
    assert list(blobs.keys()) == [key]


def test_a_blob_folder_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file where the folder would go")
    with pytest.raises(BlobStoreUnavailable, match="taken/blobs: Not a directory"):
        DirectoryBlobStore(tmp_path / "taken" / "blobs").check()
