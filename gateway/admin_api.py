"""Admin operations (an admin key): reloading the config."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from gateway.errors import InvalidRequest, PermissionDenied
from gateway.services import PrincipalDep

router = APIRouter(prefix="/api/admin")


@router.post("/reload")
async def reload_config(request: Request, principal: PrincipalDep) -> Any:
    """Read the config and policy files again (as SIGHUP does); a config that does not load is a 400
    naming the file, the field and the problem, and the running config stays."""
    if not principal.is_admin:
        raise PermissionDenied("reloading the config needs an admin key")
    reloader = getattr(request.app.state, "reloader", None)
    if reloader is None:
        raise InvalidRequest("this gateway was not started from a config file: there is nothing to reload")
    result = await run_in_threadpool(reloader.reload)
    if not result.ok:
        error = InvalidRequest(f"config reload refused, the running config stays: {result.error}",
                               code="invalid_config")
        return JSONResponse({"error": {"message": error.message, "type": error.error_type, "param": None,
                                       "code": error.code}, "reload": result.as_dict()}, status_code=400)
    return result.as_dict()
