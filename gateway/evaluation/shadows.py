"""Shadow comparisons: a share of projected requests sent again, unprojected, after the client has its answer.

For a projected request that `evaluation.shadow_share` picks (gateway/evaluation/arms.py `shadowed`), once its
run's outcome is written (the client has had its last byte), the client's transcript as it sent it goes to the
same model entry in the background, as one JSON call without the gateway's tool; the two next actions are
compared (gateway/evaluation/next_action.py) and the comparison written onto the run (status, same action,
similarity, cost). Nothing here touches the client's answer: the shadow starts after it, on a task of its own.

Spend: a shadow's cost is its own line (the run's `shadow_cost_usd`, rolled into the savings ledger's
`evaluation_cost_usd`), never counted as savings nor against the tenant's budgets. A tenant's day (UTC) of
shadows stops at `evaluation.shadow_budget_usd_per_day`: the day's spend is read from the store (every
replica's) at most every `_SPEND_REFRESH_SECONDS`, plus what this process spent or has in flight since (a
shadow in flight reserves what the client's own transcript was priced at); a shadow that would pass the
budget is recorded `over_budget` and not sent. At most `max_in_flight` run at once, up to `max_waiting`
wait for their turn (more are recorded `busy`); an upstream failure is recorded `error`. Stopping the gateway cancels those in flight.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from gateway.evaluation.next_action import compare, next_action
from gateway.exchange import DIALECTS, Exchange, complete
from gateway.ops.metrics import GatewayMetrics
from gateway.pipeline import outcomes
from gateway.pipeline.outcomes import Accounting
from gateway.threads import aside
from gateway.upstream.seam import UpstreamClient, UpstreamRequest
from gateway.wire import NeutralRequest, WireFormat
from storage.records import RecordStore

log = logging.getLogger("gateway.evaluation")
_SPEND_REFRESH_SECONDS = 30.0


@dataclass(frozen=True)
class ShadowJob:
    """What a shadow needs, taken when its request was forwarded."""

    tenant: str
    request_id: str
    budget_usd: float
    wire: WireFormat
    client: NeutralRequest
    request: UpstreamRequest  # the request as forwarded (its model entry, timeout, headers)
    accounting: Accounting  # the forwarded request's, with the client's transcript as what is sent


@dataclass
class _DaySpend:
    day: str
    stored: float  # the store's sum when read
    read_at: float
    added: float = 0.0  # spent by this process since


class Shadows:
    def __init__(self, upstream: UpstreamClient, store: RecordStore, clock: Callable[[], float],
                 metrics: GatewayMetrics | None = None, max_in_flight: int = 4, max_waiting: int = 64) -> None:
        self.upstream, self.store, self.clock, self.metrics = upstream, store, clock, metrics
        self.max_waiting = max_waiting
        self._slots = asyncio.Semaphore(max_in_flight)
        self.tasks: set[asyncio.Task[None]] = set()
        self._spend: dict[str, _DaySpend] = {}
        self._reserved: dict[str, float] = {}  # by tenant: the estimates of the shadows in flight here

    def start(self, job: ShadowJob, answer: Mapping[str, Any] | None, client_cost: float | None) -> None:
        """Begin the shadow of an answered request (called once its outcome is written)."""
        task = asyncio.get_running_loop().create_task(self._run(job, answer, client_cost or 0.0))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, job: ShadowJob, answer: Mapping[str, Any] | None, estimate: float) -> None:
        try:
            if len(self.tasks) > self.max_waiting:
                await self._record(job, "busy")
                return
            async with self._slots:
                await self._shadow(job, answer, estimate)
        except asyncio.CancelledError:
            raise
        except Exception:  # the store is away: the comparison is lost, nothing else
            log.exception("recording the shadow of run %s", job.request_id)

    async def _shadow(self, job: ShadowJob, answer: Mapping[str, Any] | None, estimate: float) -> None:
        spend = await self._day_spend(job.tenant)
        reserved = self._reserved.get(job.tenant, 0.0)
        if job.budget_usd <= 0 or spend.stored + spend.added + reserved + estimate > job.budget_usd:
            await self._record(job, "over_budget")
            return
        self._reserved[job.tenant] = reserved + estimate
        try:
            shadow, cost = await self._send(job)
        except Exception as exc:  # the upstream failed: recorded, the client never knew
            log.info("shadow of run %s failed: %s", job.request_id, type(exc).__name__)
            await self._record(job, "error")
            return
        finally:
            self._reserved[job.tenant] -= estimate
        self._spend[job.tenant].added += cost or 0.0
        agreement = compare(next_action(answer), next_action(shadow))
        await self._record(job, "ok", agreement.same_action, agreement.similarity, cost)

    async def _send(self, job: ShadowJob) -> tuple[Mapping[str, Any] | None, float | None]:
        client = replace(job.client, stream=False)
        body = job.wire.upstream_body(client, list(client.messages), [])
        request = replace(job.request, body=body, attempts=[], client_digests=None,
                          tokens=job.accounting.tokens_original)
        exchange = Exchange(dialect=DIALECTS[job.wire.upstream], request=request, rehydrator=None, client=client)
        completion = await complete(self.upstream, exchange)
        outcome = outcomes.success(completion, time.perf_counter(), job.accounting)
        return job.wire.answer_message(completion.body), outcome.cost_usd

    async def _day_spend(self, tenant: str) -> _DaySpend:
        now = self.clock()
        moment = datetime.fromtimestamp(now, timezone.utc)
        day = moment.strftime("%Y-%m-%d")
        spend = self._spend.get(tenant)
        if spend is None or spend.day != day or now - spend.read_at > _SPEND_REFRESH_SECONDS:
            since = moment.replace(hour=0, minute=0, second=0, microsecond=0)
            stored = await aside(self.store.shadow_spend, tenant, since)
            spend = self._spend[tenant] = _DaySpend(day, stored, now)
        return spend

    async def _record(self, job: ShadowJob, status: str, same: bool | None = None, similarity: float | None = None,
                      cost: float | None = None) -> None:
        await aside(self.store.record_shadow, job.request_id, job.tenant, status, same, similarity, cost)
        if self.metrics is not None:
            self.metrics.observe_shadow(job.tenant, status, same, cost)

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
