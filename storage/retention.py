"""Retention classes and garbage collection.

Every lifetime counts from the conversation's last activity (`conversations.last_active_at`,
moved by capture on each request), never from when a row was written: a conversation in use
keeps everything its projection names, however old. Once a conversation has been idle longer
than a class's lifetime, that class of its records goes:

- `assemblies`: its context assemblies (decisions, omissions, timings, old whole projections);
- `runs`: its run records, rolled up into the daily savings ledger first (storage/ledger.py);
- `memories`: the messages forwarded in place of its tool results (`forwarded_messages`);
- `artifacts`: its transcript: message nodes, tool calls and raw artifacts that no other
  conversation still keeps, then the blob files no remaining artifact names.

An assembly is kept no longer than its run and its conversation's memories (it names both).

Each batch of conversations is claimed by one UPDATE that rechecks their idleness under the row
lock capture also takes (storage/capture.py touches the conversation first), so a conversation
that comes back to life while it is being collected is either collected before its request is
captured (and the capture stores its nodes anew) or left alone. Blob files go through
`collect_blobs` (storage/deletion.py), the lifecycle every deletion shares.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Iterator

from sqlalchemy import Connection, delete, exists, select, update

from storage.deletion import Deletion
from storage.gc_lock import exclusive
from storage.ledger import roll_up_runs
from storage.schema import (
    ContextAssembly, Conversation, ForwardedMessage, ModelRun, ToolArtifact,
)

ARTIFACTS, MEMORIES, ASSEMBLIES, RUNS = 1, 2, 4, 8
ALL_CLASSES = ARTIFACTS | MEMORIES | ASSEMBLIES | RUNS
DEFAULT_BATCH = 100  # conversations per transaction
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")


def parse_duration(value: str | None) -> timedelta | None:
    """`"30d"`, `"12h"`, `"90m"`, `"45s"`, `"2w"` as a timedelta; None (keep forever) stays None."""
    if value is None:
        return None
    match = _DURATION.match(str(value))
    if match is None:
        raise ValueError(f"{value!r} is not a duration: a whole number and a unit (s, m, h, d, w), e.g. 30d")
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


@dataclass(frozen=True)
class RetentionClasses:
    """How long each class of a tenant's records outlives its conversation's last activity (None: forever)."""

    artifacts: timedelta | None = None
    memories: timedelta | None = None
    assemblies: timedelta | None = None
    runs: timedelta | None = None

    def effective(self) -> "RetentionClasses":
        """An assembly names its run and the memories it forwarded: it goes no later than either."""
        bounds = [d for d in (self.assemblies, self.runs, self.memories) if d is not None]
        return replace(self, assemblies=min(bounds) if bounds else None)


@dataclass
class GcReport:
    """What one collection removed (or, dry, would remove), per table; `skipped`: another held the lock."""

    counts: dict[str, int] = field(default_factory=dict)
    rolled_up: int = 0  # finished runs added to the savings ledger before they went
    skipped: bool = False
    dry_run: bool = False

    def add(self, table: str, count: int) -> None:
        self.counts[table] = self.counts.get(table, 0) + count


class Retention(Deletion):
    def collect_garbage(
        self,
        retention_for: Callable[[str], RetentionClasses],
        now: datetime,
        *,
        dry_run: bool = False,
        batch_size: int = DEFAULT_BATCH,
    ) -> GcReport:
        """Remove what retention allows at `now`, in short transactions of `batch_size` conversations.

        Call it under `run_gc`'s lock; a dry run counts the same rows in a transaction it rolls back.
        """
        report = GcReport(dry_run=dry_run)
        if not dry_run:
            self._collect(retention_for, now, report, batch_size, None)
            while swept := self.collect_unreferenced_blobs(limit=batch_size):  # left by a crash mid-collection
                report.add("blobs", swept)
            return report
        # A dry run is one transaction, rolled back: each row is counted once, as a real run deletes it once.
        with self._writing, self.engine.connect() as connection:
            transaction = connection.begin()
            try:
                blob_keys = self._collect(retention_for, now, report, batch_size, connection)
                report.add("blobs", self._unnamed(connection, blob_keys))
            finally:
                transaction.rollback()
        return report

    def _collect(self, retention_for: Callable[[str], RetentionClasses], now: datetime, report: GcReport,
                 batch_size: int, dry: Connection | None) -> set[str]:
        with self.engine.connect() as connection:
            tenants = sorted(connection.scalars(select(Conversation.tenant).distinct()))
        blob_keys: set[str] = set()
        for tenant in tenants:
            classes = retention_for(tenant).effective()
            for bit, lifetime in ((ASSEMBLIES, classes.assemblies), (RUNS, classes.runs),
                                  (MEMORIES, classes.memories), (ARTIFACTS, classes.artifacts)):
                if lifetime is not None:
                    blob_keys |= self._collect_class(tenant, bit, now - lifetime, report, batch_size, dry)
            if all(d is not None for d in (classes.artifacts, classes.memories, classes.assemblies, classes.runs)):
                self._forget_conversations(tenant, report, batch_size, dry)
        return blob_keys

    @contextlib.contextmanager
    def _batch(self, dry: Connection | None) -> Iterator[Connection]:
        """A short transaction of its own, or (a dry run) the one transaction it will roll back."""
        if dry is not None:
            yield dry
            return
        with self._writing, self.engine.begin() as connection:
            yield connection

    def _collect_class(self, tenant: str, bit: int, cutoff: datetime, report: GcReport, batch_size: int,
                       dry: Connection | None) -> set[str]:
        """Collect one class of the tenant's conversations idle since before `cutoff`; a dry run's
        blob keys (a real run collects the files after each batch commits)."""
        after, pending = "", set()
        while True:
            with self._batch(dry) as connection:
                claimed, last = self._claim(connection, tenant, bit, cutoff, after, batch_size)
                if last is None:
                    return pending
                after = last
                blob_keys = self._delete_class(connection, tenant, bit, claimed, report) if claimed else set()
            if dry is not None:
                pending |= blob_keys
            elif blob_keys:
                report.add("blobs", self.collect_blobs(blob_keys))

    def _claim(self, connection: Connection, tenant: str, bit: int, cutoff: datetime, after: str,
               batch_size: int) -> tuple[list[str], str | None]:
        """Mark up to `batch_size` conversations idle since before `cutoff` (ids after `after`) as
        collected for `bit`, rechecking each under its row lock: (those claimed, the last candidate)."""
        idle = (Conversation.tenant == tenant, Conversation.last_active_at < cutoff,
                Conversation.collected.op("&")(bit) == 0)
        candidates = list(connection.scalars(select(Conversation.id).where(*idle, Conversation.id > after)
                                             .order_by(Conversation.id).limit(batch_size)))
        if not candidates:
            return [], None
        claimed = connection.execute(
            update(Conversation).where(Conversation.id.in_(candidates), *idle)
            # A claimed conversation's records are about to go: its incarnation moves on, so what any
            # process holds of it is read again (storage/path_reads.py `PathFacts`), and its tool results
            # are counted again (storage/artifact_members.py).
            .values(collected=Conversation.collected.op("|")(bit), incarnation=Conversation.incarnation + 1,
                    artifact_members=None)
            .returning(Conversation.id)
        ).scalars().all()
        return sorted(claimed), candidates[-1]

    def _delete_class(self, connection: Connection, tenant: str, bit: int, conversations: list[str],
                      report: GcReport) -> set[str]:
        """Delete one class of records of `conversations`; the blob keys artifacts deleted named."""
        runs = select(ModelRun.id).where(ModelRun.tenant == tenant, ModelRun.conversation_id.in_(conversations))
        if bit in (ASSEMBLIES, RUNS):
            report.add("context_assemblies", connection.execute(
                delete(ContextAssembly).where(ContextAssembly.tenant == tenant, ContextAssembly.request_id.in_(runs))
            ).rowcount)
        if bit == RUNS:
            report.rolled_up += roll_up_runs(connection, self._insert, tenant, conversations)
            report.add("model_runs", connection.execute(
                delete(ModelRun).where(ModelRun.tenant == tenant, ModelRun.conversation_id.in_(conversations))
            ).rowcount)
        if bit == MEMORIES:
            report.add("forwarded_messages", connection.execute(
                delete(ForwardedMessage).where(ForwardedMessage.tenant == tenant,
                                               ForwardedMessage.conversation_id.in_(conversations))
            ).rowcount)
        if bit == ARTIFACTS:
            counts, blob_keys = self._delete_transcripts(connection, tenant, conversations)
            for table, count in counts.items():
                report.add(table, count)
            return blob_keys
        return set()

    @staticmethod
    def _unnamed(connection: Connection, keys: Iterable[str]) -> int:
        """How many of `keys` no artifact names (a dry run's count of the blob files that would go)."""
        return sum(1 for key in keys if not connection.scalar(select(exists().where(ToolArtifact.blob_key == key))))

    def _forget_conversations(self, tenant: str, report: GcReport, batch_size: int, dry: Connection | None) -> None:
        """The rows of conversations every class of which has gone (with lifetimes for all four)."""
        done = (Conversation.tenant == tenant, Conversation.collected == ALL_CLASSES)
        while True:
            with self._batch(dry) as connection:
                ids = list(connection.scalars(select(Conversation.id).where(*done).limit(batch_size)))
                if not ids:
                    return
                report.add("conversations", connection.execute(
                    delete(Conversation).where(Conversation.id.in_(ids), *done)).rowcount)


def run_gc(store: Any, retention_for: Callable[[str], RetentionClasses], now: datetime, *,
           dry_run: bool = False, batch_size: int = DEFAULT_BATCH) -> GcReport:
    """One collection, by one process at a time: a run that finds another holding the lock does nothing."""
    with exclusive(store.engine) as acquired:
        if not acquired:
            return GcReport(skipped=True, dry_run=dry_run)
        return store.collect_garbage(retention_for, now, dry_run=dry_run, batch_size=batch_size)
