"""The savings ledger: what each tenant sent, what went upstream, and what it saved.

Served as JSON by `GET /api/savings` and drawn by the dashboard from the same
function, so the page and the API cannot disagree.
"""
from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime, time, timedelta, timezone
from typing import Any, Iterable

from gateway.errors import InvalidRequest

_SUMMED = ("requests", "tokens_sent", "tokens_forwarded", "prompt_tokens", "cached_tokens",
           "cache_write_tokens", "completion_tokens", "cost_usd", "cost_original_usd", "evaluation_cost_usd")


def parse_moment(value: str | None, name: str, *, end: bool = False) -> datetime | None:
    """An ISO date (a whole day) or datetime; naive times are UTC."""
    if value is None or value == "":
        return None
    try:
        if len(value) == 10:
            day = date.fromisoformat(value)
            moment = datetime.combine(day + timedelta(days=1) if end else day, time(), timezone.utc)
        else:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidRequest(f"{name}: {value!r} is not an ISO date or datetime", param=name) from exc
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _empty() -> dict[str, Any]:
    return {key: 0 for key in _SUMMED} | {"cost_usd": 0.0, "cost_original_usd": 0.0, "evaluation_cost_usd": 0.0,
                                          "priced_requests": 0}


def _add(into: dict[str, Any], row: dict[str, Any]) -> None:
    for key in _SUMMED:
        into[key] += row.get(key) or 0
    if row.get("cost_usd") is not None:
        into["priced_requests"] += row["requests"]


def _finish(entry: dict[str, Any]) -> dict[str, Any]:
    saved_tokens = entry["tokens_sent"] - entry["tokens_forwarded"]
    cost, original = round(entry["cost_usd"], 6), round(entry["cost_original_usd"], 6)
    saved_usd = original - cost  # of the figures shown, so that they add up
    return {
        **entry,
        "cost_usd": cost,
        "cost_original_usd": original,
        # Shadow comparisons' spend (gateway/evaluation/shadows.py): a line of its own, never in the savings.
        "evaluation_cost_usd": round(entry["evaluation_cost_usd"], 6),
        "tokens_saved": saved_tokens,
        "tokens_saved_share": round(saved_tokens / entry["tokens_sent"], 4) if entry["tokens_sent"] else 0.0,
        "saved_usd": round(saved_usd, 6),
        "saved_share": round(saved_usd / original, 4) if original else 0.0,
    }


def ledger(rows: Iterable[dict[str, Any]], filters: dict[str, Any]) -> dict[str, Any]:
    totals = _empty()
    by_day: dict[str, dict[str, Any]] = defaultdict(_empty)
    by_model: dict[str, dict[str, Any]] = defaultdict(_empty)
    by_session: dict[tuple[str, str], dict[str, Any]] = defaultdict(_empty)
    by_tenant: dict[str, dict[str, Any]] = defaultdict(_empty)
    last_seen: dict[tuple[str, str], str] = {}
    for row in rows:
        _add(totals, row)
        _add(by_day[row["day"]], row)
        _add(by_model[row["model"]], row)
        _add(by_tenant[row["tenant"]], row)
        key = (row["tenant"], row["session"])
        _add(by_session[key], row)
        last_seen[key] = max(last_seen.get(key, ""), row["last_at"])
    sessions = [
        {"tenant": t, "session": s, "last_at": last_seen[(t, s)], **_finish(v)} for (t, s), v in by_session.items()
    ]
    sessions.sort(key=lambda r: r["last_at"], reverse=True)
    return {
        "object": "savings",
        "currency": "USD",
        "filters": filters,
        "totals": _finish(totals),
        "by_day": [{"day": d, **_finish(v)} for d, v in sorted(by_day.items())],
        "by_model": [{"model": m, **_finish(v)} for m, v in sorted(by_model.items())],
        "by_tenant": [{"tenant": t, **_finish(v)} for t, v in sorted(by_tenant.items())],
        "by_session": sessions,
    }
