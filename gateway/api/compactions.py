"""`GET /api/compactions` and `GET /api/compactions/{id}`: the remote compactions clients asked for (issue 32).

Each one says whether the provider's own endpoint answered it or the gateway did, for which run and
conversation, and the sizes in and out (storage/compactions.py). Tenant-scoped like every read route: a
tenant key sees its own (another tenant's id answers 404), an admin key every tenant's. Filters:
`conversation`, `request_id`; the newest first, at most 500.
"""
from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Depends

from gateway.errors import NotFound
from gateway.pipeline.run_recorder import outcomes_written
from gateway.services import PrincipalDep, ServicesDep
from gateway.threads import aside

router = APIRouter(prefix="/api", dependencies=[Depends(outcomes_written)])


@router.get("/compactions")
async def list_compactions(principal: PrincipalDep, services: ServicesDep, conversation: str | None = None,
                           request_id: str | None = None) -> dict[str, Any]:
    records = await aside(partial(services.store.compactions, principal.scope(), conversation=conversation,
                                  request_id=request_id))
    return {"object": "list", "data": [record.as_json() for record in records]}


@router.get("/compactions/{compaction_id}")
async def get_compaction(compaction_id: str, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    record = await aside(services.store.compaction, compaction_id, principal.scope())
    if record is None:
        raise NotFound(f"No compaction '{compaction_id}'.", param="compaction_id", code="compaction_not_found")
    return record.as_json()
