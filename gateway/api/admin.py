"""Admin operations (an admin key): reloading the config, purging a tenant."""
from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.errors import InvalidRequest, PermissionDenied
from gateway.services import PrincipalDep, ServicesDep
from gateway.threads import aside

router = APIRouter(prefix="/api/admin")
_TENANT_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")  # as the config allows


@router.post("/reload")
async def reload_config(request: Request, principal: PrincipalDep) -> Any:
    """Read the config and policy files again (as SIGHUP does); a config that does not load is a 400
    naming the file, the field and the problem, and the running config stays."""
    if not principal.is_admin:
        raise PermissionDenied("reloading the config needs an admin key")
    reloader = getattr(request.app.state, "reloader", None)
    if reloader is None:
        raise InvalidRequest("this gateway was not started from a config file: there is nothing to reload")
    result = await aside(reloader.reload)
    if not result.ok:
        error = InvalidRequest(f"config reload refused, the running config stays: {result.error}",
                               code="invalid_config")
        return JSONResponse({"error": {"message": error.message, "type": error.error_type, "param": None,
                                       "code": error.code}, "reload": result.as_dict()}, status_code=400)
    return result.as_dict()


@router.delete("/tenants/{tenant_id}")
async def purge_tenant(tenant_id: str, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    """Remove every record and blob file of a tenant (blobs another tenant's artifacts share stay),
    leaving an audit entry. A tenant still in the config may be purged: its config stays, and
    requests with its keys are recorded anew."""
    if not principal.is_admin:
        raise PermissionDenied("purging a tenant needs an admin key")
    if not _TENANT_ID.match(tenant_id):
        raise InvalidRequest(f"{tenant_id!r} is not a tenant id", param="tenant_id", code="invalid_tenant_id")
    result = await aside(services.store.purge_tenant, tenant_id, f"admin key {principal.key_id}")
    configured = any(t.id == tenant_id for t in services.settings.tenants)
    return {"object": "tenant.purged", "id": tenant_id, "audit_id": result.audit_id, "deleted": result.counts,
            "still_configured": configured}
