"""What every instance does in the background: beat, settle dead instances' runs, collect blobs."""
from __future__ import annotations

import asyncio
import logging

from starlette.concurrency import run_in_threadpool

from gateway.config import ServerSettings
from storage.records import RecordStore

log = logging.getLogger("gateway.housekeeping")
MISSED_BEATS = 3
BLOB_SWEEP_EVERY = 30  # beats: unreferenced blobs are rare (a crash mid-deletion), the sweep scans the registry


class Housekeeping:
    def __init__(self, store: RecordStore, server: ServerSettings) -> None:
        self.store = store
        self.server = server
        self.beats = 0

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
        self.beats += 1

    async def run_once(self) -> None:
        await run_in_threadpool(self._once)

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.server.heartbeat_seconds)
            try:
                await self.run_once()
            except Exception:  # the database is away: try again at the next beat
                log.exception("housekeeping failed")
