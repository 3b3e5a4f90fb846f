"""The evaluation's records: each conversation's outcome signals per arm, and the shadow comparisons.

`evaluation_conversations` sums the answered runs (`status = ok`, an arm named) of each conversation,
arm and policy version, with whether the conversation's latest answer was final; the statistics are the
gateway's (gateway/evaluation/report.py). A shadow comparison is written onto its run after the client
had its answer (`record_shadow`); a tenant's shadow spend of a day is summed from those runs
(`shadow_spend`), and rolled up into the savings ledger with them (storage/ledger.py).
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, func, select, update

from storage.schema import ModelRun
from storage.store_base import StoreBase

_RUNS = ModelRun.__table__
SUMMED = ("requests", "repeated_calls", "tool_results", "tool_errors",
          "rehydrations", "tokens_sent", "tokens_forwarded", "prompt_tokens", "cached_tokens", "cost_usd", "shadows",
          "shadows_agreed", "shadow_similarity", "shadow_cost_usd")
_KEYS = ("tenant", "conversation", "arm", "policy_version")


def _count(condition: Any) -> Any:
    return func.sum(case((condition, 1), else_=0))


class Evaluations(StoreBase):
    def evaluation_conversations(self, tenant: str | None, model: str | None = None,
                                 policy_version: str | None = None, start: datetime | None = None,
                                 end: datetime | None = None) -> list[dict[str, Any]]:
        """One row per conversation, arm and policy version: its answered runs' signals summed (`_KEYS`,
        `SUMMED`), `last_at`, and `final` (whether its latest answer was a final one)."""
        conversation = func.coalesce(_RUNS.c.conversation_id, _RUNS.c.id)
        conditions = [_RUNS.c.status == "ok", _RUNS.c.evaluation_arm.is_not(None)]
        for column, value in ((_RUNS.c.tenant, tenant), (_RUNS.c.model, model),
                              (_RUNS.c.policy_version, policy_version)):
            if value is not None:
                conditions.append(column == value)
        if start is not None:
            conditions.append(_RUNS.c.started_at >= start)
        if end is not None:
            conditions.append(_RUNS.c.started_at < end)
        shadowed = _RUNS.c.shadow_status == "ok"
        sums = (
            select(_RUNS.c.tenant, conversation.label("conversation"), _RUNS.c.evaluation_arm.label("arm"),
                   _RUNS.c.policy_version, func.count().label("requests"),
                   *(func.coalesce(func.sum(_RUNS.c[name]), 0).label(name) for name in (
                       "repeated_calls", "tool_results", "tool_errors", "rehydrations")),
                   func.coalesce(func.sum(_RUNS.c.tokens_original), 0).label("tokens_sent"),
                   func.coalesce(func.sum(_RUNS.c.tokens_forwarded), 0).label("tokens_forwarded"),
                   func.coalesce(func.sum(_RUNS.c.prompt_tokens), 0).label("prompt_tokens"),
                   func.coalesce(func.sum(_RUNS.c.cached_tokens), 0).label("cached_tokens"),
                   func.coalesce(func.sum(_RUNS.c.cost_usd), 0.0).label("cost_usd"),
                   _count(shadowed).label("shadows"),
                   _count(and_(shadowed, _RUNS.c.shadow_same_action.is_(True))).label("shadows_agreed"),
                   func.coalesce(func.sum(case((shadowed, _RUNS.c.shadow_similarity), else_=0.0)), 0.0)
                   .label("shadow_similarity"),
                   func.coalesce(func.sum(_RUNS.c.shadow_cost_usd), 0.0).label("shadow_cost_usd"),
                   func.max(_RUNS.c.started_at).label("last_at"))
            .where(*conditions)
            .group_by(_RUNS.c.tenant, conversation, _RUNS.c.evaluation_arm, _RUNS.c.policy_version)
            .subquery()
        )
        latest = _RUNS.alias("latest")
        query = (
            select(sums, latest.c.final_answer)
            .join(latest, and_(latest.c.tenant == sums.c.tenant,
                               func.coalesce(latest.c.conversation_id, latest.c.id) == sums.c.conversation,
                               latest.c.evaluation_arm == sums.c.arm, latest.c.started_at == sums.c.last_at,
                               latest.c.status == "ok"))
        )
        out: dict[tuple[Any, ...], dict[str, Any]] = {}
        with self.engine.connect() as connection:
            for row in connection.execute(query).mappings():
                key = tuple(row[name] for name in _KEYS)
                entry = out.get(key)
                if entry is None:  # two runs started at the same moment give the conversation twice
                    entry = out[key] = {**{name: row[name] for name in (*_KEYS, *SUMMED)}, "final": False}
                entry["final"] = entry["final"] or bool(row["final_answer"])
        return list(out.values())

    def record_shadow(self, request_id: str, tenant: str, status: str, same_action: bool | None = None,
                      similarity: float | None = None, cost_usd: float | None = None) -> bool:
        """Write a run's shadow comparison (once); whether it was written."""
        statement = (update(_RUNS)
                     .where(_RUNS.c.id == request_id, _RUNS.c.tenant == tenant, _RUNS.c.shadow_status.is_(None))
                     .values(shadow_status=status, shadow_same_action=same_action, shadow_similarity=similarity,
                             shadow_cost_usd=cost_usd))
        return bool(self._in_transaction(lambda connection: connection.execute(statement).rowcount))

    def shadow_spend(self, tenant: str, since: datetime) -> float:
        """What the tenant's shadow comparisons of runs started since `since` cost."""
        query = select(func.coalesce(func.sum(_RUNS.c.shadow_cost_usd), 0.0)).where(
            _RUNS.c.tenant == tenant, _RUNS.c.started_at >= since, _RUNS.c.shadow_cost_usd.is_not(None))
        with self.engine.connect() as connection:
            return float(connection.scalar(query) or 0.0)
