"""What every instance does in the background: beat, settle dead instances' runs, collect blobs, delete
expired dashboard sessions, and garbage collection on its schedule (`retention.gc_interval_seconds`, one
replica at a time)."""
from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone
from typing import Callable

from gateway.config import ServerSettings, Settings
from gateway.threads import aside
from storage.database import unavailable
from storage.records import RecordStore
from storage.retention import GcReport, run_gc

log = logging.getLogger("gateway.housekeeping")
MISSED_BEATS = 3
BLOB_SWEEP_EVERY = 30  # beats: unreferenced blobs are rare (a crash mid-deletion), the sweep scans the registry


class Housekeeping:
    def __init__(self, store: RecordStore, server: ServerSettings,
                 settings: Callable[[], Settings | None] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.server = server
        self.settings = settings  # read each time: a reload changes the retention classes
        self.clock = clock
        self.beats = 0
        self.last_gc = clock()  # the first collection waits one interval: startup stays quick

    def _once(self) -> None:
        self.store.heartbeat()
        settled = self.store.settle_interrupted_runs(
            dead_after_seconds=MISSED_BEATS * self.server.heartbeat_seconds,
            unknown_after_seconds=self.server.upstream_timeout_seconds,
        )
        if settled:
            log.warning("marked %d run(s) interrupted: their gateway stopped before they ended", settled)
        if self.beats % BLOB_SWEEP_EVERY == 0:
            self.store.collect_unreferenced_blobs()
            self.store.sweep_dashboard_sessions()  # expired sign-ins: already refused, now deleted
        self.beats += 1
        self.collect_garbage_if_due()

    def collect_garbage_if_due(self) -> GcReport | None:
        """Garbage collection, if its interval has passed since this instance last tried."""
        settings = self.settings() if self.settings is not None else None
        if settings is None:  # not serving yet
            return None
        interval = settings.retention.gc_interval_seconds
        now = self.clock()
        if interval is None or now - self.last_gc < interval:
            return None
        self.last_gc = now
        report = run_gc(self.store, settings.retention_for, datetime.fromtimestamp(now, timezone.utc),
                        batch_size=settings.retention.batch_size)
        if report.skipped:
            log.info("garbage collection skipped: another instance is collecting")
        elif report.counts:
            log.info("garbage collection removed %s", report.counts,
                     extra={"gc_counts": report.counts, "rolled_up_runs": report.rolled_up})
        return report

    async def run_once(self) -> None:
        await aside(self._once)

    async def run_forever(self) -> None:
        database_away = False  # said once when it goes, once when it is back
        while True:
            await asyncio.sleep(self.server.heartbeat_seconds)
            try:
                await self.run_once()
            except Exception as exc:  # try again at the next beat
                why = unavailable(exc)
                if why is None:
                    log.exception("housekeeping failed")
                elif not database_away:
                    log.error("the database does not answer (%s): model requests are answered 503 until it does",
                              why)
                database_away = database_away or why is not None
            else:
                if database_away:
                    log.warning("the database answers again")
                database_away = False
