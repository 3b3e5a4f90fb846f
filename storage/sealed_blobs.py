"""A blob store seen through the encryption keys: plaintext in, envelopes on disk (or in a bucket).

It keeps the content-addressed interface (`put` returns the plaintext's sha256,
`get` answers the plaintext checked against it) over any store's raw
`write`/`read`, so encryption is the same for every backend. A blob stays named
by its plaintext's sha256: one file per content, whichever tenants captured it,
as before. Envelopes are sealed with a fresh nonce each time, so `put` keeps a
file that already opens, under the current key, to the same content, and
replaces it in one step otherwise (an older key's, one stored in the clear, one
that lost its bytes). Which blobs may go is still decided by the record store's
registry (storage/deletion.py); rotation re-seals a file under that registry
row's lock (storage/rotation.py).
"""
from __future__ import annotations

import hashlib

from storage.blobs import BlobCorrupted, BlobStore
from storage.encryption import OVERHEAD, EnvelopeError, EncryptionKeys, Tampered, artifact_aad, sealed_key_id


class SealedBlobs:
    def __init__(self, store: BlobStore, encryption: EncryptionKeys) -> None:
        self.store = store
        self.encryption = encryption

    def put(self, data: bytes) -> str:
        """Store `data` (sealed if a key is set; in the clear otherwise, as the store always did)."""
        if not self.encryption.enabled:
            return self.store.put(data)
        key = hashlib.sha256(data).hexdigest()
        if not self._holds(key, data):
            self.store.write(key, self.encryption.seal(data, artifact_aad(key)))
        return key

    def _holds(self, key: str, data: bytes) -> bool:
        try:
            stored = self.store.read(key)
        except FileNotFoundError:
            return False
        if len(stored) != len(data) + OVERHEAD or sealed_key_id(stored) != self.encryption.current_id:
            return False
        try:
            return self.encryption.open(stored, artifact_aad(key)) == data
        except EnvelopeError:
            return False

    def get(self, key: str) -> bytes:
        """The plaintext under `key`: BlobCorrupted if it does not open or hash to `key`, UnknownKey
        if it was sealed under a key this process was not given, FileNotFoundError if absent."""
        try:
            data = self.encryption.open_artifact(self.store.read(key), key)
        except Tampered as exc:
            raise BlobCorrupted(key) from exc
        if hashlib.sha256(data).hexdigest() != key:
            raise BlobCorrupted(key)
        return data

    def reseal(self, key: str) -> bool:
        """Seal the file of `key` under the current key if it is not already; True if rewritten.
        The caller holds the blob's registry row (nothing may remove the file meanwhile)."""
        stored = self.store.read(key)
        if sealed_key_id(stored) == self.encryption.current_id:
            return False
        data = self.get(key)
        self.store.write(key, self.encryption.seal(data, artifact_aad(key)))
        return True

    def delete(self, key: str) -> int:
        return self.store.delete(key)
