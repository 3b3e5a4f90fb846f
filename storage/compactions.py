"""The record of every remote compaction: one row of `compactions` each (storage/schema.py `Compaction`).

Written when the compaction is answered (gateway/pipeline/compaction.py), whether the provider's own
endpoint answered it or the gateway did; read through `GET /api/compactions` (gateway/api/compactions.py),
one tenant's at a time. A row holds counts, never content: the compacted transcript is its run's.
Deleting a conversation deletes its compactions (storage/deletion.py); purging a tenant, every one of its.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select

from storage.record_types import as_utc
from storage.schema import Compaction
from storage.store_base import StoreBase

_TABLE = Compaction.__table__
LIST_LIMIT = 500


@dataclass(frozen=True)
class CompactionRecord:
    id: str
    tenant: str
    request_id: str
    conversation_id: str | None
    source: str  # "provider" or "gateway"
    endpoint: str  # "responses" or "responses/compact"
    model: str
    input_items: int
    input_tokens: int
    forwarded_tokens: int
    output_items: int
    output_bytes: int
    created_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "created_at": self.created_at.isoformat()}


def _record(row: Any) -> CompactionRecord:
    values = dict(row)
    values["created_at"] = as_utc(values["created_at"])
    return CompactionRecord(**values)


class Compactions(StoreBase):
    def record_compaction(self, record: CompactionRecord) -> None:
        with self._writing, self.engine.begin() as connection:
            connection.execute(_TABLE.insert(), [asdict(record)])

    def compaction(self, compaction_id: str, tenant: str | None) -> CompactionRecord | None:
        """One compaction, if it is the tenant's (None: any tenant's, for an admin)."""
        query = select(_TABLE).where(_TABLE.c.id == compaction_id)
        if tenant is not None:
            query = query.where(_TABLE.c.tenant == tenant)
        with self.engine.connect() as connection:
            row = connection.execute(query).mappings().first()
        return _record(row) if row is not None else None

    def compactions(self, tenant: str | None, *, conversation: str | None = None, request_id: str | None = None,
                    limit: int = LIST_LIMIT) -> list[CompactionRecord]:
        """The tenant's compactions (None: every tenant's), newest first, optionally of one conversation or run."""
        query = select(_TABLE).order_by(_TABLE.c.created_at.desc(), _TABLE.c.id).limit(limit)
        for column, value in ((_TABLE.c.tenant, tenant), (_TABLE.c.conversation_id, conversation),
                              (_TABLE.c.request_id, request_id)):
            if value is not None:
                query = query.where(column == value)
        with self.engine.connect() as connection:
            return [_record(row) for row in connection.execute(query).mappings()]
