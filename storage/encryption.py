"""Encryption at rest: AES-256-GCM envelopes for the conversation content the store keeps.

An envelope is `GWE1` + key id (8 bytes) + nonce (12) + ciphertext and tag. The key id is the
first 8 bytes of the key's sha256, so a reader finds the key an envelope needs among the current
one and the older ones still accepted (rotation); bytes without the magic were stored before
encryption was turned on and are read as they are. The associated data binds an envelope to what
it holds (an artifact's plaintext sha256, a forwarded message's digest, a node's or run's id, and
which of its columns): an envelope moved to another row, column or blob fails to open.

Text columns (a message node's JSON, a tool call's arguments, a run's answer and error) hold an
envelope in base64, which begins with `TEXT_MAGIC`. Such text is read as an envelope only in a row
whose `key_id` is set: a row written without a key holds its text as it came, whatever it begins with.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import os
from typing import Callable, Iterable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = b"GWE1"
KEY_BYTES = 32
_ID_BYTES = 8
_NONCE_BYTES = 12
_HEADER = len(MAGIC) + _ID_BYTES + _NONCE_BYTES
OVERHEAD = _HEADER + 16  # the header and GCM's tag
TEXT_MAGIC = base64.b64encode(MAGIC + bytes(2)).decode("ascii")[:5]  # "R1dFM": how an envelope's base64 begins


class EnvelopeError(Exception):
    """An envelope that cannot be opened."""


class UnknownKey(EnvelopeError):
    """Sealed under a key this process was not given (a wrong key, or an old one already dropped)."""

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        super().__init__(f"encrypted under key {key_id}, which is neither storage.encryption_key "
                         "nor one of storage.decryption_keys")


class Tampered(EnvelopeError):
    """The envelope's tag does not verify: its bytes were changed, or it belongs elsewhere."""


def key_id(key: bytes) -> str:
    """The id (16 hex digits) stored beside what a key sealed."""
    return hashlib.sha256(key).digest()[:_ID_BYTES].hex()


def is_sealed(data: bytes | None) -> bool:
    return data is not None and data[:4] == MAGIC and len(data) >= OVERHEAD


def sealed_key_id(data: bytes) -> str | None:
    """The key id in an envelope's header; None for bytes stored in the clear."""
    return data[4 : 4 + _ID_BYTES].hex() if is_sealed(data) else None


def artifact_aad(sha256: str) -> bytes:
    """What binds an artifact's envelope (inline or blob) to its content's hash."""
    return b"artifact:" + sha256.encode("ascii")


def forwarded_aad(digest: str) -> bytes:
    return b"forwarded:" + digest.encode("ascii")


def projection_aad(request_id: str) -> bytes:
    return b"projection:" + request_id.encode("utf-8")


def _bound_to(kind: bytes) -> Callable[[str], bytes]:
    """The associated data of one sealed column: its kind, then its row's id."""
    return lambda row_id: kind + b":" + row_id.encode("utf-8")


node_aad = _bound_to(b"node")  # a message node's JSON, by node id
call_arguments_aad = _bound_to(b"call-arguments")  # a tool call's arguments, by its id
artifact_arguments_aad = _bound_to(b"artifact-arguments")  # the call's arguments an artifact repeats, by artifact id
run_response_aad = _bound_to(b"run-response")  # a run's answer, by request id
run_error_aad = _bound_to(b"run-error")  # a run's error message, by request id


class EncryptionKeys:
    """The key new writes are sealed with (None: stored in the clear) and every key reads accept."""

    def __init__(self, current: bytes | None = None, older: Iterable[bytes] = ()) -> None:
        keys = ([current] if current is not None else []) + list(older)
        for key in keys:
            if len(key) != KEY_BYTES:
                raise ValueError(f"an encryption key is {KEY_BYTES} bytes")
        self._ciphers = {key_id(key): AESGCM(key) for key in keys}
        self.current_id = key_id(current) if current is not None else None
        self._current = AESGCM(current) if current is not None else None
        self._prefix = MAGIC + bytes.fromhex(self.current_id) if self.current_id else b""

    @property
    def enabled(self) -> bool:
        return self._current is not None

    def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        """The envelope of `plaintext` under the current key (the key must be set)."""
        if self._current is None:
            raise RuntimeError("no encryption key is configured")
        nonce = os.urandom(_NONCE_BYTES)
        return self._prefix + nonce + self._current.encrypt(nonce, plaintext, aad)

    def seal_if_enabled(self, plaintext: bytes, aad: bytes) -> tuple[bytes, str | None]:
        """(what to store, the key id to record): sealed under the current key, or as given without one."""
        if self._current is None:
            return plaintext, None
        return self.seal(plaintext, aad), self.current_id

    def seal_text(self, text: str | None, aad: bytes) -> str | None:
        """What a text column stores of `text`: its envelope in base64 under the current key, or `text`
        as it is without one (None stays None)."""
        if text is None or self._current is None:
            return text
        return binascii.b2a_base64(self.seal(text.encode("utf-8", "surrogatepass"), aad), newline=False).decode("ascii")

    def open_text(self, stored: str | None, aad: bytes, row_key_id: str | None) -> str | None:
        """The text a column held before `seal_text`; `row_key_id` is the row's `key_id` (None: the row
        was written in the clear, and its text is read as it is)."""
        if stored is None or row_key_id is None or not stored.startswith(TEXT_MAGIC):
            return stored
        try:
            data = binascii.a2b_base64(stored, strict_mode=True)
        except binascii.Error as exc:
            raise Tampered("a sealed text column is not base64") from exc
        if not is_sealed(data):
            raise Tampered("a sealed text column holds no envelope")
        return self.open(data, aad).decode("utf-8", "surrogatepass")

    def open(self, data: bytes, aad: bytes) -> bytes:
        """The plaintext of an envelope; bytes stored in the clear come back as they are."""
        if not is_sealed(data):
            return data
        found = sealed_key_id(data)
        assert found is not None
        cipher = self._ciphers.get(found)
        if cipher is None:
            raise UnknownKey(found)
        try:
            return cipher.decrypt(data[len(MAGIC) + _ID_BYTES : _HEADER], data[_HEADER:], aad)
        except InvalidTag as exc:
            raise Tampered(f"envelope under key {found} failed its integrity check") from exc

    def open_artifact(self, data: bytes, sha256: str) -> bytes:
        """An artifact's stored bytes (inline or blob) as the tool gave them, unchecked against
        `sha256` but for one case: content stored in the clear that merely begins like an envelope."""
        try:
            return self.open(data, artifact_aad(sha256))
        except EnvelopeError:
            if hashlib.sha256(data).hexdigest() == sha256:
                return data
            raise


NO_ENCRYPTION = EncryptionKeys()
