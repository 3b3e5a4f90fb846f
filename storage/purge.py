"""Tenant purge: every record and blob of one tenant removed, one audit entry left.

Every table is visited, dependents first (`Base.metadata.sorted_tables`
reversed), so a table added later is purged without being named here: a table
with a `tenant` column loses that tenant's rows; one without loses the rows
that reference (by foreign key) a row of the tenant (`conversation_nodes` by
its node). Deletes go in batches of short transactions. Blob files go through
`collect_blobs`, which keeps a file any other artifact (of any tenant) still
names: blobs are shared by content.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, delete, false, func, or_, select, tuple_

from storage.deletion import Deletion
from storage.schema import Base, TenantPurge, ToolArtifact

PURGE_BATCH = 1000


@dataclass(frozen=True)
class PurgeResult:
    audit_id: str
    counts: dict[str, int]


def _tenant_condition(table: Table, tenant: str) -> Any:
    """Which rows of `table` are the tenant's (None: the table holds nothing of tenants)."""
    if "tenant" in table.c:
        return table.c.tenant == tenant
    references = []
    for key in table.foreign_keys:
        target = key.column.table
        if "tenant" in target.c:
            references.append(key.parent.in_(select(key.column).where(target.c.tenant == tenant)))
    return or_(false(), *references) if references else None


class Purge(Deletion):
    def tenant_row_counts(self, tenant: str) -> dict[str, int]:
        """How many rows of each table are the tenant's (what a purge would remove)."""
        counts = {}
        with self.engine.connect() as connection:
            for table in reversed(Base.metadata.sorted_tables):
                condition = _tenant_condition(table, tenant)
                if condition is not None and table is not TenantPurge.__table__:
                    counts[table.name] = int(connection.scalar(
                        select(func.count()).select_from(table).where(condition)) or 0)
        return counts

    def purge_tenant(self, tenant: str, actor: str, batch_size: int = PURGE_BATCH) -> PurgeResult:
        """Remove every row of `tenant` from every table and the blob files only it used; the audit
        entry (who, when, rows per table) is what remains. Earlier audit entries of it stay too."""
        with self.engine.connect() as connection:
            blob_keys = set(connection.scalars(select(ToolArtifact.blob_key).where(
                ToolArtifact.tenant == tenant, ToolArtifact.blob_key.is_not(None)).distinct()))
        counts: dict[str, int] = {}
        for table in reversed(Base.metadata.sorted_tables):
            condition = _tenant_condition(table, tenant)
            if condition is None or table is TenantPurge.__table__:
                continue
            counts[table.name] = self._delete_in_batches(table, condition, batch_size)
        counts["blobs"] = self.collect_blobs(blob_keys)
        audit_id = f"purge_{uuid.uuid4().hex}"
        with self._writing, self.engine.begin() as connection:
            connection.execute(TenantPurge.__table__.insert().values(
                id=audit_id, tenant=tenant, actor=actor, purged_at=self._now(),
                counts_json=json.dumps(counts, sort_keys=True)))
        return PurgeResult(audit_id=audit_id, counts=counts)

    def _delete_in_batches(self, table: Table, condition: Any, batch_size: int) -> int:
        key = list(table.primary_key.columns)
        target = key[0] if len(key) == 1 else tuple_(*key)
        total = 0
        while True:
            with self._writing, self.engine.begin() as connection:
                batch = select(*key).where(condition).limit(batch_size)
                rows = [tuple(r) if len(key) > 1 else r[0] for r in connection.execute(batch)]
                deleted = connection.execute(delete(table).where(target.in_(rows))).rowcount if rows else 0
            total += deleted
            if deleted < batch_size:
                return total

    def purge_history(self, tenant: str) -> list[dict[str, Any]]:
        """The audit entries of the tenant's purges, oldest first."""
        with self.engine.connect() as connection:
            rows = connection.execute(select(TenantPurge).where(TenantPurge.tenant == tenant)
                                      .order_by(TenantPurge.purged_at))
            return [{"id": r.id, "tenant": r.tenant, "actor": r.actor, "purged_at": r.purged_at.isoformat(),
                     "counts": json.loads(r.counts_json)} for r in rows]
