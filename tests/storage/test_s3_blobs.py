"""The S3 blob store against a local S3-compatible server (moto's), alone and behind the gateway.

The races of blob collection against capture run over both stores in
tests/storage/test_blob_lifecycle.py.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator

import pytest
from botocore.exceptions import ClientError

from gateway.app import create_app
from storage.blobs import BlobCorrupted, BlobStoreUnavailable
from storage.s3_blobs import S3BlobStore
from tests.conftest import (
    OTHER_TENANT_KEY,
    S3_CREDENTIALS,
    RunningGateway,
    free_port,
    settings_for,
    start_gateway,
)
from testkit.fake_upstream import FakeUpstream
from tests.gateway.api.test_deletion import BIG, conversation, send  # BIG: over the 1 KiB inline bound below


def objects(blobs: S3BlobStore) -> dict[str, bytes]:
    """Everything in the bucket, read behind the store's back."""
    listing = blobs.client.list_objects_v2(Bucket=blobs.bucket).get("Contents", [])
    return {item["Key"]: blobs.client.get_object(Bucket=blobs.bucket, Key=item["Key"])["Body"].read()
            for item in listing}


def overwrite(blobs: S3BlobStore, key: str, data: bytes) -> None:
    blobs.client.put_object(Bucket=blobs.bucket, Key=blobs.prefix + key, Body=data)


def count_uploads(blobs: S3BlobStore) -> list[str]:
    uploads: list[str] = []
    blobs.client.meta.events.register("before-call.s3.PutObject",
                                      lambda params, **_: uploads.append(params["url_path"]))
    return uploads


def test_put_stores_the_bytes_under_their_hash(s3_blobs: S3BlobStore) -> None:
    data = b"some artifact bytes\n" * 100
    key = s3_blobs.put(data)
    assert key == hashlib.sha256(data).hexdigest()
    assert objects(s3_blobs) == {f"gw/blobs/{key}": data}
    assert s3_blobs.get(key) == data
    assert list(s3_blobs.keys()) == [key]
    assert s3_blobs.put(b"") == hashlib.sha256(b"").hexdigest() and s3_blobs.get(s3_blobs.put(b"")) == b""


def test_put_of_content_already_there_checks_it_and_skips_the_upload(s3_blobs: S3BlobStore) -> None:
    data = b"x" * 5000
    uploads = count_uploads(s3_blobs)
    key = s3_blobs.put(data)
    assert s3_blobs.put(data) == key
    assert len(uploads) == 1


@pytest.mark.parametrize("replacement", [b"y" * 5000, b"y" * 10], ids=["same size", "other size"])
def test_put_rewrites_an_object_that_lost_its_bytes(s3_blobs: S3BlobStore, replacement: bytes) -> None:
    data = b"x" * 5000
    key = s3_blobs.put(data)
    overwrite(s3_blobs, key, replacement)  # the same size with other bytes, or another size
    uploads = count_uploads(s3_blobs)
    assert s3_blobs.put(data) == key
    assert len(uploads) == 1
    assert s3_blobs.get(key) == data


def test_get_detects_an_object_overwritten_behind_its_back(s3_blobs: S3BlobStore) -> None:
    key = s3_blobs.put(b"the original output")
    overwrite(s3_blobs, key, b"the tampered output")
    with pytest.raises(BlobCorrupted):
        s3_blobs.get(key)


def test_missing_keys_and_deletion(s3_blobs: S3BlobStore) -> None:
    absent = hashlib.sha256(b"never stored").hexdigest()
    with pytest.raises(FileNotFoundError):
        s3_blobs.get(absent)
    assert s3_blobs.delete(absent) == 0
    key = s3_blobs.put(b"to be collected")
    assert s3_blobs.delete(key) == 1
    assert s3_blobs.delete(key) == 0
    assert objects(s3_blobs) == {} and list(s3_blobs.keys()) == []
    for bad in ("../etc/passwd", absent.upper(), absent[:-1]):
        with pytest.raises(ValueError):
            s3_blobs.get(bad)


def test_keys_are_the_blobs_under_the_prefix_only(s3_blobs: S3BlobStore) -> None:
    key = s3_blobs.put(b"mine")
    s3_blobs.client.put_object(Bucket=s3_blobs.bucket, Key="gw/blobs/README", Body=b"not a blob")
    s3_blobs.client.put_object(Bucket=s3_blobs.bucket, Key=f"elsewhere/{key}", Body=b"mine")
    assert list(s3_blobs.keys()) == [key]


def test_a_store_over_a_missing_bucket_fails_loudly(s3_endpoint: str, s3_blobs: S3BlobStore) -> None:
    s3_blobs.check()
    blobs = S3BlobStore.connect("no-such-bucket", endpoint_url=s3_endpoint, **S3_CREDENTIALS)
    with pytest.raises(BlobStoreUnavailable, match=f"bucket 'no-such-bucket' at {s3_endpoint}: no such bucket"):
        blobs.check()
    with pytest.raises(ClientError, match="NoSuchBucket"):
        blobs.put(b"lost?")
    unreachable = S3BlobStore.connect("blobs", endpoint_url=f"http://127.0.0.1:{free_port()}", **S3_CREDENTIALS)
    with pytest.raises(BlobStoreUnavailable, match="Could not connect"):
        unreachable.check()


async def test_the_gateway_does_not_start_without_its_bucket(fake: FakeUpstream, sqlite_url: str, tmp_path: Path,
                                                              s3_endpoint: str) -> None:
    blobs = {"backend": "s3", "bucket": "no-such-bucket", "endpoint_url": s3_endpoint, **S3_CREDENTIALS}
    app = create_app(settings_for(fake.api_base, sqlite_url, tmp_path, storage={"url": sqlite_url, "blobs": blobs}))
    with pytest.raises(BlobStoreUnavailable, match="no-such-bucket"):
        async with app.router.lifespan_context(app):
            pass


@pytest.fixture
def gateway(fake: FakeUpstream, storage_url: str, tmp_path: Path, s3_endpoint: str, s3_bucket: str,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningGateway]:
    monkeypatch.setenv("TEST_S3_SECRET", S3_CREDENTIALS["secret_access_key"])
    blobs = {"backend": "s3", "bucket": s3_bucket, "prefix": "gateway/", "endpoint_url": s3_endpoint,
             "region": S3_CREDENTIALS["region"], "access_key_id": S3_CREDENTIALS["access_key_id"],
             "secret_access_key": "os.environ/TEST_S3_SECRET"}
    settings = settings_for(fake.api_base, storage_url, tmp_path,
                            storage={"url": storage_url, "blobs": blobs, "inline_max_bytes": 1024})
    running, server = start_gateway(settings, fake)
    yield running
    server.stop()


def test_the_gateway_keeps_large_results_in_the_bucket(gateway: RunningGateway) -> None:
    blobs = gateway.store.blobs
    assert isinstance(blobs, S3BlobStore)
    key = hashlib.sha256(BIG.encode()).hexdigest()
    mine = send(gateway, conversation("Build project A."), label="ticket-1")
    theirs = send(gateway, conversation("Build project A."), key=OTHER_TENANT_KEY)  # the same bytes, shared
    assert objects(blobs) == {f"gateway/{key}": BIG.encode()}
    with gateway.client() as http:
        artifact = http.get(f"/api/artifacts/{mine['captured_artifact_ids'][0]}")
        assert artifact.status_code == 200 and artifact.content == BIG.encode()
        assert http.delete("/api/sessions/ticket-1").json()["deleted"]["blobs"] == 0  # globex still names it
    assert list(blobs.keys()) == [key]
    with gateway.client(key=OTHER_TENANT_KEY) as http:
        assert http.get(f"/api/artifacts/{theirs['captured_artifact_ids'][0]}").content == BIG.encode()
        deleted = http.delete(f"/api/sessions/{theirs['conversation_id']}").json()["deleted"]
    assert deleted["tool_artifacts"] == 1 and deleted["blobs"] == 1
    assert objects(blobs) == {}


def test_a_tampered_object_is_reported_not_served(gateway: RunningGateway) -> None:
    record = send(gateway, conversation("Build project C."))
    blobs = gateway.store.blobs
    key = hashlib.sha256(BIG.encode()).hexdigest()
    overwrite(blobs, key, BIG.replace("build", "BUILD", 1).encode())
    with gateway.client() as http:
        response = http.get(f"/api/artifacts/{record['captured_artifact_ids'][0]}")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "artifact_corrupted"


def test_a_bucket_gone_while_serving_fails_the_capture_and_forwards_nothing(gateway: RunningGateway) -> None:
    blobs = gateway.store.blobs
    blobs.client.delete_bucket(Bucket=blobs.bucket)
    calls = len(gateway.fake.requests)
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": conversation("Build D.")})
    assert response.status_code == 500 and response.json()["error"]["code"] == "internal_error"  # as a database down
    assert len(gateway.fake.requests) == calls  # nothing went upstream without its durable capture
    blobs.client.create_bucket(Bucket=blobs.bucket)
    record = send(gateway, conversation("Build D."))
    with gateway.client() as http:
        assert http.get(f"/api/artifacts/{record['captured_artifact_ids'][0]}").content == BIG.encode()


def test_with_encryption_the_bucket_holds_no_plaintext(fake: FakeUpstream, sqlite_url: str, tmp_path: Path,
                                                       s3_endpoint: str, s3_bucket: str) -> None:
    """Encryption at rest covers the bucket as it covers a folder: the objects are envelopes, and the
    artifact still reads back exactly."""
    import base64
    import os

    marker = "S3-MARKER-5e4f-card-holder"
    blobs = {"backend": "s3", "bucket": s3_bucket, "prefix": "gateway/", "endpoint_url": s3_endpoint,
             "region": S3_CREDENTIALS["region"], "access_key_id": S3_CREDENTIALS["access_key_id"],
             "secret_access_key": S3_CREDENTIALS["secret_access_key"]}
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, storage={
        "url": sqlite_url, "blobs": blobs, "inline_max_bytes": 1024,
        "encryption_key": base64.b64encode(os.urandom(32)).decode()})
    running, server = start_gateway(settings, fake)
    try:
        content = f"{marker}\n{BIG}"
        captured = send(running, [{"role": "user", "content": "Build it."},
                                  {"role": "assistant", "content": None, "tool_calls": [
                                      {"id": "c1", "type": "function",
                                       "function": {"name": "build", "arguments": "{}"}}]},
                                  {"role": "tool", "tool_call_id": "c1", "content": content}])
        assert isinstance(running.store.blobs, S3BlobStore)  # capture seals above it (store.sealed_blobs)
        stored = objects(running.store.blobs)
        assert list(stored) == [f"gateway/{hashlib.sha256(content.encode()).hexdigest()}"]
        assert not any(marker.encode() in data or b"build log line" in data for data in stored.values())
        with running.client() as http:
            artifact = http.get(f"/api/artifacts/{captured['captured_artifact_ids'][0]}")
        assert artifact.status_code == 200 and artifact.content == content.encode()
    finally:
        server.stop()
