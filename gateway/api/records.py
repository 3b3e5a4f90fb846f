"""The tenant-scoped read API: artifacts and requests.

A tenant key sees only its tenant's records (another tenant's id answers
404, as if it did not exist); an admin key sees every tenant's.
"""
from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from gateway.dashboard.savings import ledger, parse_moment
from gateway.errors import GatewayError, InvalidRequest, NotFound, key_unavailable
from gateway.pipeline.conversation_names import name_runs, name_sessions
from gateway.pipeline.run_recorder import outcomes_written
from gateway.services import PrincipalDep, ServicesDep
from gateway.threads import aside
from storage.blobs import BlobCorrupted
from storage.encryption import UnknownKey
from storage.record_types import ArtifactCorrupted, ArtifactRecord

router = APIRouter(prefix="/api", dependencies=[Depends(outcomes_written)])


async def _artifact(services: ServicesDep, principal: PrincipalDep, artifact_id: str) -> ArtifactRecord:
    record = await aside(services.store.get_artifact, artifact_id, principal.scope())
    if record is None:
        raise NotFound(f"No artifact '{artifact_id}'.", param="artifact_id", code="artifact_not_found")
    return record


@router.get("/artifacts/{artifact_id}")
async def artifact_raw(artifact_id: str, principal: PrincipalDep, services: ServicesDep) -> Response:
    """The exact raw bytes of a tool result (or of a call's arguments, `args_...`); metadata in headers."""
    if artifact_id.startswith("args_"):
        arguments, meta = await _call_arguments(services, principal, artifact_id)
        return Response(content=arguments.encode("utf-8", "surrogatepass"), media_type="application/json",
                        headers={"x-artifact-id": artifact_id, "x-artifact-sha256": meta["sha256"],
                                 "x-artifact-tool-call-id": meta["tool_call_id"]})
    record = await _artifact(services, principal, artifact_id)
    try:
        data = await aside(services.store.artifact_bytes, record)
    except (ArtifactCorrupted, BlobCorrupted, FileNotFoundError) as exc:
        raise GatewayError(
            f"Artifact '{artifact_id}' failed its integrity check.", code="artifact_corrupted"
        ) from exc
    except UnknownKey as exc:
        raise key_unavailable(f"Artifact '{artifact_id}'", exc) from exc
    headers = {
        "x-artifact-id": record.id,
        "x-artifact-sha256": record.sha256,
        "x-artifact-status": record.status,
        "x-artifact-tokens": str(record.tokens),
        "x-artifact-tool-call-id": record.tool_call_id,
        "etag": f'"{record.sha256}"',
        "cache-control": "private, max-age=31536000, immutable",
    }
    if record.tool_name:
        headers["x-artifact-tool-name"] = record.tool_name
    return Response(content=data, media_type=record.content_type, headers=headers)


async def _call_arguments(services: ServicesDep, principal: PrincipalDep, artifact_id: str) -> tuple[str, dict[str, Any]]:
    found = await aside(services.store.get_call_arguments, artifact_id, principal.scope())
    if found is None:
        raise NotFound(f"No artifact '{artifact_id}'.", param="artifact_id", code="artifact_not_found")
    return found


@router.get("/artifacts/{artifact_id}/metadata")
async def artifact_metadata(artifact_id: str, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    if artifact_id.startswith("args_"):
        return (await _call_arguments(services, principal, artifact_id))[1]
    record = await _artifact(services, principal, artifact_id)
    return record.metadata()


@router.delete("/sessions/{session_key}")
async def delete_session(session_key: str, principal: PrincipalDep, services: ServicesDep,
                         tenant: str | None = None) -> dict[str, Any]:
    """Delete one conversation, by its id or session label, and what only it uses (a tenant key: its own;
    admin: `?tenant=`). Conversations that share its opening keep what they share."""
    owner = principal.scope() or tenant
    if owner is None:
        raise InvalidRequest("an admin key names the tenant: ?tenant=<id>", param="tenant")
    counts = await aside(services.store.delete_conversation, owner, session_key)
    if not counts:
        raise NotFound(f"No session '{session_key}'.", param="session_key", code="session_not_found")
    return {"object": "session.deleted", "id": session_key, "tenant": owner, "deleted": counts}


@router.get("/savings")
async def savings(
    principal: PrincipalDep,
    services: ServicesDep,
    start: str | None = None,
    end: str | None = None,
    model: str | None = None,
    session: str | None = None,
    tenant: str | None = None,
) -> dict[str, Any]:
    """The savings ledger: per tenant, model, session and day (tenant keys see their own)."""
    return await savings_ledger(services, principal, start, end, model, session, tenant)


def scoped_tenant(principal: PrincipalDep, tenant: str | None) -> str | None:
    """The tenant a read covers: a tenant key's own (another named is 404, as if it did not exist), an
    admin's `?tenant=`, else None (every tenant)."""
    scope = principal.scope()
    if tenant and scope is not None and tenant != scope:
        raise NotFound(f"No tenant '{tenant}'.", param="tenant", code="tenant_not_found")
    return tenant or scope


async def savings_ledger(services: ServicesDep, principal: PrincipalDep, start: str | None, end: str | None,
                         model: str | None, session: str | None, tenant: str | None) -> dict[str, Any]:
    chosen = scoped_tenant(principal, tenant)
    since, until = parse_moment(start, "start"), parse_moment(end, "end", end=True)
    rows = await aside(services.store.savings_rows, chosen, since, until, model, session)
    filters = {"tenant": chosen, "start": start, "end": end, "model": model, "session": session}
    result = ledger(rows, filters)
    await name_sessions(services.store, result["by_session"])
    return result


@router.get("/requests/{request_id}/projection")
async def request_projection(request_id: str, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    """The messages the model was given for this request, as forwarded."""
    messages = await aside(services.store.forwarded_messages, request_id, principal.scope())
    if messages is None:
        raise NotFound(f"No projection recorded for request '{request_id}'.", param="request_id",
                       code="request_not_found")
    return {"object": "projection", "request_id": request_id, "messages": messages}


@router.get("/requests/{request_id}")
async def request_record(request_id: str, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    record = await aside(services.store.get_run, request_id, principal.scope())
    if record is None:
        raise NotFound(f"No request '{request_id}'.", param="request_id", code="request_not_found")
    run = dict(record.run)
    await name_runs(services.store, [run])
    return {
        **run,
        "captured_artifact_ids": [a.id for a in record.captured_artifacts],
        "captured_artifacts": [a.metadata() for a in record.captured_artifacts],
        "path_artifact_ids": list(record.path_artifact_ids),
        "assembly": record.assembly.as_dict() if record.assembly else None,
        "compactions": [c.as_json() for c in await aside(partial(services.store.compactions, principal.scope(),
                                                                 request_id=request_id))],
    }
