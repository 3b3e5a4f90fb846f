"""Key rotation: re-seal under the current key whatever an older key (or none) sealed.

Safe while gateways serve: rows are read in batches outside any write, and each
is replaced by compare-and-swap (its stored bytes unchanged since they were
read), in one short transaction per batch. A capture or rotation that got there
first wins and the row is left alone; a reader sees the old envelope or the new
one, both of which open. A blob file is re-sealed under its registry row's lock,
the lock capture and collection take (storage/deletion.py), and replaced in one
step; the registry row's key id is the hint of what is left to do, the file's
own header the truth, so an interrupted rotation is finished by running it again.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable

from sqlalchemy import Table, bindparam, or_, select, tuple_, update

from storage.blobs import BlobCorrupted
from storage.encryption import EnvelopeError, EncryptionKeys, Tampered, artifact_aad, forwarded_aad, projection_aad
from storage.schema import Blob, ContextAssembly, ForwardedMessage, ToolArtifact
from storage.store_base import StoreBase


@dataclass
class RotationReport:
    resealed: dict[str, int] = field(default_factory=dict)  # by table ("blobs": files)
    unreadable: list[str] = field(default_factory=list)  # what could not be opened, and why

    def as_dict(self) -> dict[str, Any]:
        return {"resealed": self.resealed, "unreadable": self.unreadable}


@dataclass(frozen=True)
class _Sealed:
    """A column that holds envelopes: its table, key and payload, and what binds an envelope to its row."""

    table: Table
    keys: tuple[str, ...]
    payload: str
    aad: Callable[[Any], bytes]
    hashed: bool = False  # the plaintext hashes to the row's sha256 (an artifact's content)

    def open(self, encryption: EncryptionKeys, row: Any) -> bytes:
        stored = getattr(row, self.payload)
        if not self.hashed:
            return encryption.open(stored, self.aad(row))
        plain = encryption.open_artifact(stored, row.sha256)
        if hashlib.sha256(plain).hexdigest() != row.sha256:
            raise Tampered("the content does not match its sha256")
        return plain


_COLUMNS = (
    _Sealed(ToolArtifact.__table__, ("id",), "content", lambda row: artifact_aad(row.sha256), hashed=True),
    _Sealed(ForwardedMessage.__table__, ("conversation_id", "digest"), "message_zlib",
            lambda row: forwarded_aad(row.digest)),
    _Sealed(ContextAssembly.__table__, ("request_id",), "forwarded_zlib",
            lambda row: projection_aad(row.request_id)),
)


class Rotation(StoreBase):
    def rotate_keys(self, batch: int = 200) -> RotationReport:
        """Re-seal every payload (sealed or in the clear) not under the current key."""
        if not self.encryption.enabled:
            raise ValueError("storage.encryption_key is not set: there is no key to rotate to")
        report = RotationReport()
        for column in _COLUMNS:
            report.resealed[column.table.name] = self._rotate_column(column, batch, report)
        report.resealed["blobs"] = self._rotate_blobs(batch, report)
        return report

    def _not_current(self, table: Table) -> Any:
        return or_(table.c.key_id.is_(None), table.c.key_id != self.encryption.current_id)

    def _rotate_column(self, column: _Sealed, batch: int, report: RotationReport) -> int:
        table, payload = column.table, column.table.c[column.payload]
        keys = [table.c[k] for k in column.keys]
        swap = update(table).where(*(c == bindparam(f"p_{c.name}") for c in keys), payload == bindparam("p_old")) \
            .values({column.payload: bindparam("p_new"), "key_id": self.encryption.current_id})
        query = select(*keys, payload, *([table.c.sha256] if column.hashed else [])) \
            .where(payload.is_not(None), self._not_current(table)).order_by(*keys).limit(batch)
        done = 0
        after: tuple[Any, ...] | None = None
        while True:
            page = query if after is None else query.where(tuple_(*keys) > tuple_(*after))
            with self.engine.connect() as connection:
                rows = connection.execute(page).all()
            if not rows:
                return done
            after = tuple(getattr(rows[-1], k) for k in column.keys)
            changes = []
            for row in rows:
                try:
                    plain = column.open(self.encryption, row)
                except EnvelopeError as problem:
                    report.unreadable.append(f"{table.name} {'/'.join(str(getattr(row, k)) for k in column.keys)}: "
                                             f"{problem}")
                    continue
                changes.append({**{f"p_{k}": getattr(row, k) for k in column.keys}, "p_old": getattr(row, column.payload),
                                "p_new": self.encryption.seal(plain, column.aad(row))})
            with self._writing, self.engine.begin() as connection:
                for change in changes:  # each swaps only if the row still holds what was read
                    done += connection.execute(swap, change).rowcount

    def _rotate_blobs(self, batch: int, report: RotationReport) -> int:
        done = 0
        after = ""
        while True:
            with self.engine.connect() as connection:
                keys = list(connection.scalars(select(Blob.key).where(Blob.key > after, self._not_current(Blob.__table__))
                                               .order_by(Blob.key).limit(batch)))
            if not keys:
                return done
            after = keys[-1]
            for key in keys:
                done += self._reseal_blob(key, report)

    def _reseal_blob(self, key: str, report: RotationReport) -> int:
        with self._writing, self.engine.connect() as connection:
            transaction = connection.begin()
            try:
                # The registry row's lock: no capture or collection of this file until the commit.
                locked = connection.execute(update(Blob).where(Blob.key == key, self._not_current(Blob.__table__))
                                            .values(key_id=self.encryption.current_id)).rowcount
                if not locked:  # captured under the current key, or collected, meanwhile
                    transaction.rollback()
                    return 0
                try:
                    rewritten = self.sealed_blobs.reseal(key)
                except (FileNotFoundError, BlobCorrupted, EnvelopeError) as problem:
                    report.unreadable.append(f"blob {key}: {type(problem).__name__} {problem}".rstrip())
                    transaction.rollback()
                    return 0
                transaction.commit()
                return int(rewritten)
            except BaseException:
                if transaction.is_active:
                    transaction.rollback()
                raise
