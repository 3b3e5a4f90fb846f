"""`GET /api/evaluation`: whether the projection changes what the agents do (gateway/evaluation/report.py).

Tenant-scoped like every read route: a tenant key sees its own conversations (another tenant named answers
404), an admin key sees every tenant's or the one `?tenant=` names. Filters: model, policy version, from
and to (ISO dates or datetimes; `start`/`end` are accepted too, as on `/api/savings`).
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query

from gateway.dashboard.savings import parse_moment
from gateway.api.records import scoped_tenant
from gateway.evaluation.report import evaluation_report
from gateway.pipeline.run_recorder import outcomes_written
from gateway.services import PrincipalDep, ServicesDep
from gateway.threads import aside

router = APIRouter(prefix="/api", dependencies=[Depends(outcomes_written)])


async def evaluation_of(services: ServicesDep, principal: PrincipalDep, tenant: str | None, model: str | None,
                        policy_version: str | None, start: str | None, end: str | None) -> dict[str, Any]:
    chosen = scoped_tenant(principal, tenant)
    since, until = parse_moment(start, "from"), parse_moment(end, "to", end=True)
    rows = await aside(services.store.evaluation_conversations, chosen, model, policy_version, since, until)
    filters = {"tenant": chosen, "model": model, "policy_version": policy_version, "from": start, "to": end}
    return evaluation_report(rows, filters)


@router.get("/evaluation")
async def evaluation(
    principal: PrincipalDep,
    services: ServicesDep,
    tenant: str | None = None,
    model: str | None = None,
    policy_version: str | None = None,
    from_: str | None = Query(None, alias="from"),
    to: str | None = None,
    start: str | None = None,
    end: str | None = None,
) -> dict[str, Any]:
    """Each outcome signal per arm with its 95% interval, the difference between arms and a verdict; the
    shadow comparisons' agreement."""
    return await evaluation_of(services, principal, tenant, model, policy_version, from_ or start, to or end)
