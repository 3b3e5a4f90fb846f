"""Gateway instances and the runs a dead one left pending.

Each serving process registers an instance row and beats its heartbeat every
few seconds; each run records the instance that serves it. A process killed
mid-request (kill -9, a lost machine) cannot record its runs' outcomes, so any
instance settles them: a pending run whose instance has missed its heartbeats,
or whose instance is unknown and which is older than the upstream timeout,
becomes `interrupted`. A real outcome recorded later still wins.
"""
from __future__ import annotations

import os
import socket
import uuid
from datetime import timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from storage.schema import GatewayInstance, ModelRun
from storage.store_base import StoreBase

INTERRUPTED = {
    "status": "interrupted",
    "error_type": "interrupted",
    "error_message": "the gateway serving this run stopped before it ended",
}


class Instances(StoreBase):
    def register_instance(self) -> str:
        """Register this process as a serving instance; its id goes on every run it opens."""
        instance = f"gw_{uuid.uuid4().hex}"
        now = self._now()
        with Session(self.engine) as session, session.begin():
            session.add(GatewayInstance(id=instance, host=socket.gethostname()[:256], pid=os.getpid(),
                                        started_at=now, heartbeat_at=now))
        self.instance_id = instance
        return instance

    def heartbeat(self) -> None:
        now = self._now()
        with Session(self.engine) as session, session.begin():
            statement = self._insert(GatewayInstance).values(
                id=self.instance_id, host=socket.gethostname()[:256], pid=os.getpid(), started_at=now, heartbeat_at=now)
            session.execute(statement.on_conflict_do_update(index_elements=[GatewayInstance.id],
                                                            set_={"heartbeat_at": now}))

    def settle_interrupted_runs(self, *, dead_after_seconds: float, unknown_after_seconds: float) -> int:
        """Mark `interrupted` the pending runs no live instance serves; returns how many."""
        now = self._now()
        alive = select(GatewayInstance.id).where(
            GatewayInstance.heartbeat_at >= now - timedelta(seconds=dead_after_seconds))
        with Session(self.engine) as session, session.begin():
            settled = session.execute(
                update(ModelRun)
                .where(ModelRun.status == "pending", or_(
                    ModelRun.instance_id.not_in(alive),
                    ModelRun.instance_id.is_(None)
                    & (ModelRun.started_at < now - timedelta(seconds=unknown_after_seconds)),
                ))
                .values(**INTERRUPTED, finished_at=now)
            ).rowcount
            session.execute(delete(GatewayInstance).where(
                GatewayInstance.heartbeat_at < now - timedelta(seconds=dead_after_seconds)))
        return settled

    def retire_instance(self) -> int:
        """At a clean shutdown: whatever this instance still has pending is interrupted."""
        if self.instance_id is None:
            return 0
        now = self._now()
        with Session(self.engine) as session, session.begin():
            settled = session.execute(
                update(ModelRun).where(ModelRun.status == "pending", ModelRun.instance_id == self.instance_id)
                .values(**INTERRUPTED, finished_at=now)
            ).rowcount
            session.execute(delete(GatewayInstance).where(GatewayInstance.id == self.instance_id))
        return settled
