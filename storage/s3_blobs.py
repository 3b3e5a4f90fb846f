"""Blobs in an S3-compatible bucket, for replicas on several machines.

The same contract as DirectoryBlobStore (storage/blobs.py): an object is named
`<prefix><sha256 of its bytes>`, `put` checks an object that is already there
(its size, then its bytes' hash) before it skips the upload, `get` checks the
hash. S3 and the servers that speak its API read their own writes, so the
registry protocol of storage/deletion.py keeps blobs safe across a delete racing
a capture here as it does on a disk: `put` and `delete` both finish before the
transaction holding the registry row commits.

The calls are synchronous; the record store makes them from worker threads, and
one boto3 client is safe to share between threads.
"""
from __future__ import annotations

import base64
import hashlib
from typing import Any, Iterator

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from storage.blobs import BlobCorrupted, BlobStoreUnavailable, is_blob_key

_MISSING = {"404", "NoSuchKey", "NotFound"}
# Every request thread may be inside a capture at once; botocore's default pool is 10.
MAX_CONNECTIONS = 50


def _missing(error: ClientError) -> bool:
    return str(error.response.get("Error", {}).get("Code")) in _MISSING


class S3BlobStore:
    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"

    @classmethod
    def connect(cls, bucket: str, *, prefix: str = "", endpoint_url: str | None = None, region: str | None = None,
                access_key_id: str | None = None, secret_access_key: str | None = None) -> "S3BlobStore":
        """A store over its own client; credentials not given come from boto3's usual chain
        (environment, shared files, instance role)."""
        client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, region_name=region,
            aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key,
            config=Config(max_pool_connections=MAX_CONNECTIONS, retries={"mode": "standard"}),
        )
        return cls(client, bucket, prefix)

    def check(self) -> None:
        where = f"bucket {self.bucket!r} at {self.client.meta.endpoint_url}"
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code"))
            reason = {"404": "no such bucket", "403": "access denied"}.get(code, code)
            raise BlobStoreUnavailable(f"{where}: {reason}") from exc
        except BotoCoreError as exc:  # unreachable, no credentials...
            raise BlobStoreUnavailable(f"{where}: {exc}") from exc

    def _name(self, key: str) -> str:
        if not is_blob_key(key):
            raise ValueError(f"not a blob key: {key!r}")
        return self.prefix + key

    def put(self, data: bytes) -> str:
        digest = hashlib.sha256(data)
        key = digest.hexdigest()
        if self._holds(key, len(data)):
            return key
        # The server checks the bytes it received against the checksum before it keeps them.
        self.client.put_object(Bucket=self.bucket, Key=self._name(key), Body=data,
                               ChecksumSHA256=base64.b64encode(digest.digest()).decode("ascii"))
        return key

    def write(self, key: str, data: bytes) -> None:
        """Store `data` under `key` as given (an encryption envelope under its plaintext's hash:
        storage/sealed_blobs.py); an object replaces its predecessor in one step."""
        checksum = base64.b64encode(hashlib.sha256(data).digest()).decode("ascii")
        self.client.put_object(Bucket=self.bucket, Key=self._name(key), Body=data, ChecksumSHA256=checksum)

    def read(self, key: str) -> bytes:
        """The bytes stored under `key`, unchecked; FileNotFoundError if there are none."""
        return self._read(key)

    def _holds(self, key: str, size: int) -> bool:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._name(key))
        except ClientError as exc:
            if _missing(exc):
                return False
            raise
        if head["ContentLength"] != size:
            return False
        try:
            return hashlib.sha256(self._read(key)).hexdigest() == key
        except FileNotFoundError:
            return False

    def _read(self, key: str) -> bytes:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._name(key))
        except ClientError as exc:
            if _missing(exc):
                raise FileNotFoundError(key) from exc
            raise
        with response["Body"] as body:
            return body.read()

    def get(self, key: str) -> bytes:
        data = self._read(key)
        if hashlib.sha256(data).hexdigest() != key:
            raise BlobCorrupted(key)
        return data

    def delete(self, key: str) -> int:
        """Remove a blob; 1 if it was there, 0 if not (S3's delete itself does not say)."""
        name = self._name(key)
        try:
            self.client.head_object(Bucket=self.bucket, Key=name)
        except ClientError as exc:
            if _missing(exc):
                return 0
            raise
        self.client.delete_object(Bucket=self.bucket, Key=name)
        return 1

    def keys(self) -> Iterator[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        for page in pages:
            for item in page.get("Contents", ()):
                name = item["Key"][len(self.prefix):]
                if is_blob_key(name):
                    yield name
