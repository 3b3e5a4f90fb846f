"""Content-addressed blob stores for large artifacts: a directory (the default) or S3 (storage/s3_blobs.py).

Both keep the same contract. A store holds bytes under the sha256 of those bytes
and knows nothing of what they mean (an encrypted envelope is bytes like any
other). `put` is idempotent and trusts an existing blob only after checking it;
`get` checks the hash and raises BlobCorrupted, or FileNotFoundError for a key it
does not hold; `delete` is called only by blob collection (storage/deletion.py),
which decides under the registry row's lock that nothing relies on the blob.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Iterator, Protocol

_KEY = re.compile(r"^[0-9a-f]{64}$")


class BlobCorrupted(Exception):
    """A blob's bytes no longer match the hash they were stored under."""


class BlobStoreUnavailable(Exception):
    """The store cannot be used as configured (a bucket that is not there, a folder that cannot be made)."""


def is_blob_key(name: str) -> bool:
    return bool(_KEY.match(name))


class BlobStore(Protocol):
    def put(self, data: bytes) -> str:
        """Store `data`; its key (the sha256 hex digest), once it is durable."""

    def get(self, key: str) -> bytes:
        """The bytes under `key`, checked against it."""

    def delete(self, key: str) -> int:
        """Remove a blob; 1 if it was there, 0 if not."""

    def keys(self) -> Iterator[str]:
        """Every key held, in no particular order (for sweeps and audits; not a hot path)."""

    def check(self) -> None:
        """Raise BlobStoreUnavailable, saying why, unless the store can be used (once, at start)."""

    def write(self, key: str, data: bytes) -> None:
        """Store `data` under `key` as it is, durably (encryption's envelopes: storage/sealed_blobs.py)."""

    def read(self, key: str) -> bytes:
        """The bytes under `key` as stored (FileNotFoundError if none)."""


class DirectoryBlobStore:
    """Blobs as files named by their sha256, written atomically and fsynced.

    Writes are idempotent: the same content always lands on the same key, so
    two replicas capturing the same artifact cannot conflict. A file already
    there is read back and checked before it is trusted; one that is missing
    its bytes is written again. Which files may go is decided by the record
    store (storage/deletion.py), never here.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        if not is_blob_key(key):
            raise ValueError(f"not a blob key: {key!r}")
        return self.root / key[:2] / key

    def put(self, data: bytes) -> str:
        key = hashlib.sha256(data).hexdigest()
        if not self._holds(self._path(key), key, len(data)):
            self.write(key, data)
        return key

    def write(self, key: str, data: bytes) -> None:
        """Store `data` under `key` as given, replacing what was there in one step.

        The raw half of the interface: an encrypted blob (storage/sealed_blobs.py) is an
        envelope stored under the sha256 of its plaintext, which only its reader can check.
        """
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def read(self, key: str) -> bytes:
        """The bytes stored under `key`, unchecked; FileNotFoundError if there are none."""
        return self._path(key).read_bytes()

    @staticmethod
    def _holds(target: Path, key: str, size: int) -> bool:
        try:
            if target.stat().st_size != size:
                return False
            return hashlib.sha256(target.read_bytes()).hexdigest() == key
        except FileNotFoundError:
            return False

    def delete(self, key: str) -> int:
        """Remove a blob; 1 if it was there, 0 if not."""
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            return 0
        return 1

    def get(self, key: str) -> bytes:
        data = self.read(key)
        if hashlib.sha256(data).hexdigest() != key:
            raise BlobCorrupted(key)
        return data

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BlobStoreUnavailable(f"blob folder {self.root}: {exc.strerror}") from exc

    def keys(self) -> Iterator[str]:
        if not self.root.is_dir():
            return
        for folder in self.root.iterdir():
            if folder.is_dir() and len(folder.name) == 2:
                for file in folder.iterdir():  # skips the .tmp- files of writes in flight
                    if is_blob_key(file.name) and file.name.startswith(folder.name):
                        yield file.name
