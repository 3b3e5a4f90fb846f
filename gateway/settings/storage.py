"""The `storage:` section: the database URL and pool, where blobs live (a folder or an S3-compatible
bucket), and the encryption keys at rest (checked to decode to AES-256 keys, never repeated in errors)."""
from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator

from gateway.settings.strict import Strict
from storage.encryption import KEY_BYTES, EncryptionKeys


_S3_ONLY = ("bucket", "prefix", "endpoint_url", "region", "access_key_id", "secret_access_key")


class BlobSettings(Strict):
    """Where blobs (artifacts over inline_max_bytes) live: a folder, or an S3-compatible bucket."""

    backend: Literal["directory", "s3"] = "directory"
    dir: str | None = Field(None, validate_default=True)  # directory: ./blobs unless given
    bucket: str | None = Field(None, validate_default=True)  # s3: required
    prefix: str = ""  # s3: objects are named <prefix>/<sha256>
    endpoint_url: str | None = None  # s3: MinIO, Ceph, R2...; none: AWS
    region: str | None = None
    # s3: both or neither (then boto3's usual chain: environment, shared files, instance role).
    access_key_id: str | None = None
    secret_access_key: str | None = Field(None, validate_default=True)

    @field_validator("dir")
    @classmethod
    def _dir_for_directory(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("backend") == "s3":
            raise ValueError("only for backend: directory")
        return value

    @field_validator(*_S3_ONLY)
    @classmethod
    def _s3_fields_for_s3(cls, value: Any, info: ValidationInfo) -> Any:
        if info.data.get("backend") == "directory" and value not in (None, ""):
            raise ValueError("only for backend: s3")
        if info.field_name == "bucket" and info.data.get("backend") == "s3" and not value:
            raise ValueError("required for backend: s3")
        if info.field_name == "secret_access_key" and (value is None) != (info.data.get("access_key_id") is None):
            raise ValueError("give access_key_id and secret_access_key together, or neither")
        return value


def _key_bytes(value: str) -> bytes:
    return base64.b64decode(value.strip(), validate=True)


def _valid_key(value: str) -> str:
    """A key that decodes to 32 bytes; the message never repeats it (config errors are logged)."""
    try:
        key = _key_bytes(value)
    except (binascii.Error, ValueError):
        raise ValueError("not base64: an encryption key is 32 random bytes in base64 "
                         "(python -c \"import os,base64;print(base64.b64encode(os.urandom(32)).decode())\")") from None
    if len(key) != KEY_BYTES:
        raise ValueError(f"an encryption key is {KEY_BYTES} bytes in base64; this one decodes to {len(key)}")
    return value


_EncryptionKey = Annotated[str, AfterValidator(_valid_key)]


class StorageSettings(Strict):
    url: str = "sqlite:///./gateway.db"
    blob_dir: str | None = None  # the same as blobs.dir (kept for configs written before storage.blobs)
    blobs: BlobSettings = Field(BlobSettings(), validate_default=False)
    inline_max_bytes: int = Field(64 * 1024, ge=0)
    # PostgreSQL connections per process (and as many again in overflow): every request holds one
    # while it captures and once more while its outcome is written, from the worker-thread pool.
    pool_size: int = Field(20, ge=1, le=500)
    # Encryption at rest of captured tool results (inline, blobs, forwarded memories): an AES-256
    # key, 32 bytes in base64, best given as `os.environ/NAME`. Unset: stored in the clear.
    encryption_key: _EncryptionKey | None = Field(None, repr=False)
    # Older keys, still accepted for reading until `gateway encryption rotate` has re-sealed everything.
    decryption_keys: list[_EncryptionKey] = Field(default_factory=list, repr=False)

    @field_validator("url")
    @classmethod
    def _known_backend(cls, url: str) -> str:
        if not (url.startswith("sqlite:///") or url.startswith("postgresql")):
            raise ValueError("use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB")
        return url

    @field_validator("blobs")
    @classmethod
    def _one_blob_folder(cls, blobs: BlobSettings, info: ValidationInfo) -> BlobSettings:
        if info.data.get("blob_dir") is not None:
            raise ValueError("give storage.blob_dir or storage.blobs, not both")
        return blobs

    @property
    def blob_folder(self) -> str:
        """The directory backend's folder (relative to the config file)."""
        return self.blob_dir or self.blobs.dir or "./blobs"

    def encryption_keys(self) -> EncryptionKeys:
        current = _key_bytes(self.encryption_key) if self.encryption_key else None
        return EncryptionKeys(current, [_key_bytes(k) for k in self.decryption_keys])
