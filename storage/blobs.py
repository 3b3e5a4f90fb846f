"""Content-addressed blob store for large artifacts (a directory by default)."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Protocol


class BlobStore(Protocol):
    """What the record store needs of a blob store: content-addressed `put`/`get` (the key is the
    sha256 of the bytes, checked), `delete`, and the raw `write`/`read` of bytes under a given key
    that encryption at rest stores its envelopes with (storage/sealed_blobs.py)."""

    def put(self, data: bytes) -> str: ...
    def get(self, key: str) -> bytes: ...
    def delete(self, key: str) -> int: ...
    def write(self, key: str, data: bytes) -> None: ...
    def read(self, key: str) -> bytes: ...


class BlobCorrupted(Exception):
    """A blob's bytes no longer match the hash they were stored under."""


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
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
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
