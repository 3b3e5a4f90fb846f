"""The daily savings ledger: finished runs rolled up before retention removes them.

`/api/savings` sums finished runs per tenant, model, session and day
(`Reads.savings_rows`). Garbage collection adds a conversation's finished runs
to `savings_ledger` rows of the same key in the transaction that deletes them,
so the ledger reads the rolled-up rows plus the runs still kept, each run
counted exactly once, and its totals do not move when detail is collected.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Callable

from sqlalchemy import Connection, and_, case, func, null, select
from sqlalchemy.sql.elements import ColumnElement

from storage.record_types import as_utc
from storage.schema import ModelRun, SavingsLedgerDay

SUMMED = ("tokens_sent", "tokens_forwarded", "prompt_tokens", "cached_tokens", "cache_write_tokens",
          "completion_tokens", "cost_usd", "cost_original_usd", "evaluation_cost_usd")
ROW_KEYS = ("tenant", "model", "session", "day", "requests", *SUMMED, "first_at", "last_at")
_LEDGER = SavingsLedgerDay.__table__


def session_key_column() -> ColumnElement[Any]:
    """The session a run counts under in the ledger: its label, else its conversation."""
    return func.coalesce(ModelRun.session_label, ModelRun.conversation_id, ModelRun.tree_id)


def run_sums(*conditions: Any) -> Any:
    """Finished runs summed per tenant, model, session and day, in ROW_KEYS order."""
    session_col = session_key_column()
    day = func.date(ModelRun.started_at)
    return (
        select(
            ModelRun.tenant, ModelRun.model, session_col, day,
            func.count(), func.sum(ModelRun.tokens_original), func.sum(ModelRun.tokens_forwarded),
            func.sum(ModelRun.prompt_tokens), func.sum(ModelRun.cached_tokens),
            func.sum(ModelRun.cache_write_tokens), func.sum(ModelRun.completion_tokens),
            func.sum(ModelRun.cost_usd), func.sum(ModelRun.cost_original_usd), func.sum(ModelRun.shadow_cost_usd),
            func.min(ModelRun.started_at), func.max(ModelRun.started_at),
        )
        .where(ModelRun.status == "ok", *conditions)
        .group_by(ModelRun.tenant, ModelRun.model, session_col, day)
    )


def roll_up_runs(connection: Connection, insert: Callable[..., Any], tenant: str, conversations: list[str]) -> int:
    """Add the finished runs of `conversations` to the ledger (before they are deleted); how many."""
    rows = [dict(zip(ROW_KEYS, values)) for values in connection.execute(
        run_sums(ModelRun.tenant == tenant, ModelRun.conversation_id.in_(conversations)))]
    if not rows:
        return 0
    for row in rows:
        row["day"] = str(row["day"])[:10]
    statement = insert(_LEDGER)
    incoming = statement.excluded

    def plus(column: str) -> Any:  # None + None stays None: a sum of unpriced runs is no price
        mine, theirs = _LEDGER.c[column], incoming[column]
        return case((and_(mine.is_(None), theirs.is_(None)), null()),
                    else_=func.coalesce(mine, 0) + func.coalesce(theirs, 0))

    set_ = {column: plus(column) for column in SUMMED}
    set_ |= {
        "requests": _LEDGER.c.requests + incoming.requests,
        "first_at": case((incoming.first_at < _LEDGER.c.first_at, incoming.first_at), else_=_LEDGER.c.first_at),
        "last_at": case((incoming.last_at > _LEDGER.c.last_at, incoming.last_at), else_=_LEDGER.c.last_at),
    }
    keys = [_LEDGER.c.tenant, _LEDGER.c.day, _LEDGER.c.model, _LEDGER.c.session]
    for row in rows:  # one row at a time: a batch's rows may share a key only across statements
        connection.execute(statement.on_conflict_do_update(index_elements=keys, set_=set_), row)
    return sum(int(row["requests"]) for row in rows)


def ledger_rows(connection: Connection, tenant: str | None, start: datetime | None, end: datetime | None,
                model: str | None, session_key: str | None) -> list[dict[str, Any]]:
    """The rolled-up rows the filters select. They are known per day: a start or end within a day
    counts a rolled-up row only if all its runs fall inside (whole-day filters are exact)."""
    query = select(*(_LEDGER.c[key] for key in ROW_KEYS))
    if tenant is not None:
        query = query.where(_LEDGER.c.tenant == tenant)
    if start is not None:
        query = query.where(_LEDGER.c.first_at >= start)
    if end is not None:
        query = query.where(_LEDGER.c.last_at < end)
    if model is not None:
        query = query.where(_LEDGER.c.model == model)
    if session_key is not None:
        query = query.where(_LEDGER.c.session == session_key)
    return [dict(zip(ROW_KEYS, values)) for values in connection.execute(query)]


def merged(*sources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the same tenant, model, session and day added together; times as ISO strings."""
    out: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for rows in sources:
        for row in rows:
            row = dict(row, day=str(row["day"])[:10], first_at=as_utc(row["first_at"]),
                       last_at=as_utc(row["last_at"]))
            key = (row["tenant"], row["model"], row["session"], row["day"])
            into = out.get(key)
            if into is None:
                out[key] = row
                continue
            into["requests"] += row["requests"]
            for column in SUMMED:
                if row[column] is not None:
                    into[column] = (into[column] or 0) + row[column]
            into["first_at"] = min(into["first_at"], row["first_at"])
            into["last_at"] = max(into["last_at"], row["last_at"])
    for row in out.values():
        row["first_at"] = row["first_at"].isoformat()
        row["last_at"] = row["last_at"].isoformat()
    return list(out.values())
