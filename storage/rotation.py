"""Key rotation: re-seal under the current key whatever an older key (or none) sealed.

Every sealed column of a row (an artifact's content and arguments, a run's answer and error
message, ...) is re-sealed together, and the row's key id moves with them. Safe while gateways
serve: rows are read in batches outside any write, and each is replaced by compare-and-swap (its
stored values unchanged since they were read), in one short transaction per batch. A capture, an
outcome or a rotation that got there first wins and the row is left for the next run; a reader
sees the old envelopes or the new ones, both of which open. A blob file is re-sealed under its registry row's lock,
the lock capture and collection take (storage/deletion.py), and replaced in one
step; the registry row's key id is the hint of what is left to do, the file's
own header the truth, so an interrupted rotation is finished by running it again.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable

from sqlalchemy import Table, and_, bindparam, func, or_, select, tuple_, update

from storage.blobs import BlobCorrupted
from storage.encryption import (
    TEXT_MAGIC,
    EnvelopeError,
    EncryptionKeys,
    Tampered,
    artifact_aad,
    artifact_arguments_aad,
    call_arguments_aad,
    forwarded_aad,
    node_aad,
    projection_aad,
    run_error_aad,
    run_response_aad,
)
from storage.schema import Blob, ContextAssembly, ForwardedMessage, MessageNode, ModelRun, ToolArtifact, ToolCall
from storage.store_base import StoreBase


@dataclass
class RotationReport:
    resealed: dict[str, int] = field(default_factory=dict)  # by table ("blobs": files)
    unreadable: list[str] = field(default_factory=list)  # what could not be opened, and why

    def as_dict(self) -> dict[str, Any]:
        return {"resealed": self.resealed, "unreadable": self.unreadable}


@dataclass(frozen=True)
class _Payload:
    """A column that holds envelopes, and what binds an envelope to its row."""

    name: str
    aad: Callable[[Any], bytes]
    kind: str = "bytes"  # bytes | text (base64, storage/encryption.py) | artifact (bytes hashing to the row's sha256)
    # Text the versions before revision 0013 stored in the clear beside a key id (an artifact's arguments,
    # whose content it sealed): found by its first characters as well as by its row's key id.
    clear_beside_key: bool = False

    def open(self, encryption: EncryptionKeys, row: Any) -> Any:
        stored = getattr(row, self.name)
        if stored is None:
            return None
        if self.kind == "text":
            return encryption.open_text(stored, self.aad(row), row.key_id)
        if self.kind == "bytes":
            return encryption.open(stored, self.aad(row))
        plain = encryption.open_artifact(stored, row.sha256)
        if hashlib.sha256(plain).hexdigest() != row.sha256:
            raise Tampered("the content does not match its sha256")
        return plain

    def seal(self, encryption: EncryptionKeys, row: Any, plain: Any) -> Any:
        if plain is None:
            return None
        if self.kind == "text":
            return encryption.seal_text(plain, self.aad(row))
        return encryption.seal(plain, self.aad(row))


@dataclass(frozen=True)
class _Sealed:
    """A table whose rows hold envelopes: its key, its sealed columns, the other columns their bindings read."""

    table: Table
    keys: tuple[str, ...]
    payloads: tuple[_Payload, ...]
    extra: tuple[str, ...] = ()


_TABLES = (
    _Sealed(ToolArtifact.__table__, ("id",), (
        _Payload("content", lambda row: artifact_aad(row.sha256), "artifact"),
        _Payload("arguments", lambda row: artifact_arguments_aad(row.id), "text", clear_beside_key=True)),
        extra=("sha256",)),
    _Sealed(ForwardedMessage.__table__, ("conversation_id", "digest"), (
        _Payload("message_zlib", lambda row: forwarded_aad(row.digest)),)),
    _Sealed(ContextAssembly.__table__, ("request_id",), (
        _Payload("forwarded_zlib", lambda row: projection_aad(row.request_id)),)),
    _Sealed(MessageNode.__table__, ("id",), (_Payload("message_json", lambda row: node_aad(row.id), "text"),)),
    _Sealed(ToolCall.__table__, ("id",), (_Payload("arguments", lambda row: call_arguments_aad(row.id), "text"),)),
    _Sealed(ModelRun.__table__, ("id",), (
        _Payload("response_json", lambda row: run_response_aad(row.id), "text"),
        _Payload("error_message", lambda row: run_error_aad(row.id), "text"))),
)


class Rotation(StoreBase):
    def rotate_keys(self, batch: int = 200) -> RotationReport:
        """Re-seal every payload (sealed or in the clear) not under the current key."""
        if not self.encryption.enabled:
            raise ValueError("storage.encryption_key is not set: there is no key to rotate to")
        report = RotationReport()
        for sealed in _TABLES:
            report.resealed[sealed.table.name] = self._rotate_table(sealed, batch, report)
        report.resealed["blobs"] = self._rotate_blobs(batch, report)
        return report

    def _not_current(self, table: Table) -> Any:
        return or_(table.c.key_id.is_(None), table.c.key_id != self.encryption.current_id)

    def _to_reseal(self, sealed: _Sealed) -> Any:
        """Rows with something sealed under another key, or stored in the clear."""
        table = sealed.table
        stored = or_(*(table.c[p.name].is_not(None) for p in sealed.payloads))
        clear = [and_(table.c[p.name].is_not(None), func.substr(table.c[p.name], 1, len(TEXT_MAGIC)) != TEXT_MAGIC)
                 for p in sealed.payloads if p.clear_beside_key]
        return or_(and_(stored, self._not_current(table)), *clear)

    def _rotate_table(self, sealed: _Sealed, batch: int, report: RotationReport) -> int:
        table, payloads = sealed.table, sealed.payloads
        keys = [table.c[k] for k in sealed.keys]
        swap = update(table).where(
            *(c == bindparam(f"p_{c.name}") for c in keys),
            *(table.c[p.name].is_not_distinct_from(bindparam(f"old_{p.name}", type_=table.c[p.name].type))
              for p in payloads),
        ).values({**{p.name: bindparam(f"new_{p.name}", type_=table.c[p.name].type) for p in payloads},
                  "key_id": self.encryption.current_id})
        columns = [*keys, *(table.c[p.name] for p in payloads), table.c.key_id, *(table.c[e] for e in sealed.extra)]
        query = select(*columns).where(self._to_reseal(sealed)).order_by(*keys).limit(batch)
        done = 0
        after: tuple[Any, ...] | None = None
        while True:
            page = query if after is None else query.where(tuple_(*keys) > tuple_(*after))
            with self.engine.connect() as connection:
                rows = connection.execute(page).all()
            if not rows:
                return done
            after = tuple(getattr(rows[-1], k) for k in sealed.keys)
            changes = []
            for row in rows:
                try:
                    new = {f"new_{p.name}": p.seal(self.encryption, row, p.open(self.encryption, row))
                           for p in payloads}
                except EnvelopeError as problem:
                    report.unreadable.append(f"{table.name} {'/'.join(str(getattr(row, k)) for k in sealed.keys)}: "
                                             f"{problem}")
                    continue
                changes.append({**{f"p_{k}": getattr(row, k) for k in sealed.keys},
                                **{f"old_{p.name}": getattr(row, p.name) for p in payloads}, **new})
            if not changes:
                continue
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
