"""Spend budgets (USD per UTC day and month) of tenants and of keys made through the API.

Checked before a request is forwarded: a budget is crossed when the period's
spend has reached it (the run that crosses it completes; its cost is known only
afterwards). A run's cost is added when its outcome is recorded. The counters
(`storage/spend.py`) live in Redis when `redis.url` is set, so every replica
sees every replica's spend; else in the process, seeded from the runs the
database recorded for the period, so each process counts its own spend on top
of what was recorded when it first looked. While Redis does not answer, each
process counts in its own way, re-seeded from the database every minute, and
the counters it could not update in Redis are re-seeded when Redis is back
(`FallbackSpendCounters`): no recorded cost is lost from a budget.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable

from gateway.access.auth import Principal
from gateway.config import BudgetSettings
from gateway.errors import BudgetExceeded
from gateway.threads import off_loop
from storage.records import RecordStore
from storage.spend import SpendCounters

log = logging.getLogger("gateway.budgets")
_TTL_MARGIN_SECONDS = 3600  # a counter outlives its period by this much


@dataclass(frozen=True)
class Period:
    name: str  # day | month
    label: str  # d20261130 | m202611: part of the counter's name
    start: datetime
    reset: datetime


def periods(moment: datetime) -> tuple[Period, Period]:
    """The UTC day and month `moment` falls in."""
    day = moment.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    next_month = (month + timedelta(days=32)).replace(day=1)
    return (Period("day", day.strftime("d%Y%m%d"), day, day + timedelta(days=1)),
            Period("month", month.strftime("m%Y%m"), month, next_month))


@dataclass(frozen=True)
class _Budget:
    who: str  # for the message: tenant 'acme' | API key 'key_...'
    subject: str  # for the counter's name: tenant:acme | key:key_...
    tenant: str
    api_key_id: str | None
    period: Period
    limit: float

    @property
    def counter(self) -> str:
        return f"{self.subject}:{self.period.label}"


class Budgets:
    def __init__(self, counters: SpendCounters, store: RecordStore, clock: Callable[[], float]) -> None:
        self.counters = counters
        self._store = store
        self._clock = clock

    def _budgets(self, principal: Principal, now: datetime) -> list[_Budget]:
        assert principal.tenant is not None
        found: list[_Budget] = []
        owners: list[tuple[str, str, str | None, BudgetSettings | None]] = []
        if principal.api_key is not None:
            owners.append((f"API key '{principal.key_id}'", f"key:{principal.key_id}", principal.key_id,
                           principal.key_budget))
        owners.append((f"tenant '{principal.tenant.id}'", f"tenant:{principal.tenant.id}", None,
                       principal.tenant.budget))
        for who, subject, key_id, budget in owners:
            if budget is None:
                continue
            for period, limit in zip(periods(now), (budget.usd_per_day, budget.usd_per_month)):
                if limit is not None:
                    found.append(_Budget(who, subject, principal.tenant.id, key_id, period, limit))
        return found

    async def check(self, principal: Principal) -> None:
        """BudgetExceeded (429) naming the first spent budget: the key's before the tenant's, the day's
        before the month's."""
        now = datetime.fromtimestamp(self._clock(), timezone.utc)
        budgets = self._budgets(principal, now)
        if not budgets:
            return
        spent = await self.counters.get([b.counter for b in budgets])
        for budget, value in zip(budgets, spent):
            if value is None:
                value = await self._seed(budget, now)
            if value >= budget.limit:
                wait = max(1, int((budget.period.reset - now).total_seconds()))
                reset = budget.period.reset.strftime("%Y-%m-%dT%H:%M:%SZ")
                raise BudgetExceeded(
                    f"Budget exceeded for {budget.who}: ${value:.6f} spent of ${budget.limit:g} per "
                    f"{budget.period.name}. It resets at {reset} (in {wait}s).",
                    headers={"retry-after": str(wait)})

    async def _seed(self, budget: _Budget, now: datetime) -> float:
        """The period's recorded spend, from the database, as the counter's start (unless another
        replica set it meanwhile: then its value)."""
        recorded = await off_loop(self._store.spend_since, budget.period.start, budget.tenant,
                                           budget.api_key_id)
        ttl = int((budget.period.reset - now).total_seconds()) + _TTL_MARGIN_SECONDS
        await self.counters.seed(budget.counter, recorded, ttl)
        value = (await self.counters.get([budget.counter]))[0]
        return recorded if value is None else value

    async def spend(self, tenant: str, api_key_id: str | None, usd: float, started_at: datetime) -> None:
        """Add a run's cost to the counters of its tenant and key for the periods it started in
        (counters nobody has read this period stay unset: their seed will include this run)."""
        if usd <= 0:
            return
        subjects = [f"tenant:{tenant}"] + ([f"key:{api_key_id}"] if api_key_id else [])
        names = [f"{s}:{p.label}" for s in subjects for p in periods(started_at)]
        try:
            await self.counters.add(names, usd)
        except Exception:  # the cost is in the database: the counter's next seed has it
            log.exception("could not add $%s to the spend of tenant %s", usd, tenant)
