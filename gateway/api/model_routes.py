"""The model routes: each one translates its wire format and hands the request to the pipeline."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.access.auth import Principal
from gateway.api import passthrough
from gateway.errors import ModelNotFound, NotFound, PermissionDenied
from gateway.pipeline import request_path as pipeline
from gateway.pipeline.run_recorder import outcomes_written
from gateway.services import PrincipalDep, Services, ServicesDep
from gateway.threads import off_loop
from gateway.wire.anthropic_messages import ANTHROPIC_MESSAGES
from gateway.wire.openai_chat import OPENAI_CHAT
from gateway.wire.openai_responses import OPENAI_RESPONSES, OPENAI_RESPONSES_COMPACT, request_id_for

router = APIRouter()


@router.post("/v1/chat/completions")
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(request: Request, services: ServicesDep) -> Response:
    return await pipeline.handle(request, services, OPENAI_CHAT)


@router.post("/v1/messages")
@router.post("/messages", include_in_schema=False)
async def messages(request: Request, services: ServicesDep) -> Response:
    return await pipeline.handle(request, services, ANTHROPIC_MESSAGES)


@router.post("/v1/messages/count_tokens")
@router.post("/messages/count_tokens", include_in_schema=False)
async def count_tokens(request: Request, services: ServicesDep) -> dict[str, int]:
    """The input tokens the gateway would forward for this request (its projection), counted here."""
    return {"input_tokens": await pipeline.count_tokens(request, services, ANTHROPIC_MESSAGES)}


@router.post("/v1/responses")
@router.post("/responses", include_in_schema=False)
async def responses(request: Request, services: ServicesDep) -> Response:
    return await pipeline.handle(request, services, OPENAI_RESPONSES)


@router.post("/v1/responses/compact")
@router.post("/responses/compact", include_in_schema=False)
async def compact_response(request: Request, services: ServicesDep) -> Response:
    """OpenAI's compaction endpoint, for every provider (gateway/pipeline/compaction.py)."""
    return await pipeline.handle(request, services, OPENAI_RESPONSES_COMPACT)


async def _stored_response(services: ServicesDep, principal: PrincipalDep, response_id: str) -> tuple[str, dict[str, Any]]:
    request_id = request_id_for(response_id)
    await outcomes_written()  # a response just sent may not be recorded yet
    record = await off_loop(services.store.get_run, request_id, principal.scope()) if request_id else None
    response = record.run.get("response") if record and record.run.get("wire_format") == "openai.responses" else None
    if not response or response.get("store") is False:
        raise NotFound(f"No response with id '{response_id}'.", param="response_id", code="response_not_found")
    return str(request_id), response


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    """A stored response (the gateway's own record of it), tenant-scoped."""
    return (await _stored_response(services, principal, response_id))[1]


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    request_id, _ = await _stored_response(services, principal, response_id)
    tenant = principal.scope()
    if tenant is None:
        raise PermissionDenied("an admin key reads responses; deleting one needs its tenant's key")
    await off_loop(services.store.forget_response, tenant, request_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.post("/v1/embeddings")
@router.post("/embeddings", include_in_schema=False)
async def embeddings(request: Request, services: ServicesDep) -> Response:
    return await passthrough.handle(request, services, "embeddings")


@router.post("/v1/completions")
@router.post("/completions", include_in_schema=False)
async def completions(request: Request, services: ServicesDep) -> Response:
    return await passthrough.handle(request, services, "completions")


def check_model_name(model_id: str, principal: Principal, services: Services) -> None:
    """ModelNotFound unless the caller may use the name (an exact entry, or a name a wildcard entry matches)."""
    model = services.settings.model(model_id)
    allowed = principal.tenant.models if principal.tenant else None
    if model is None or (allowed is not None and model.name not in allowed):
        raise ModelNotFound(f"The model '{model_id}' does not exist or you do not have access to it.",
                            param="model")


def model_names(principal: Principal, services: Services) -> list[str]:
    """The config's model names the caller may use, a model of several deployments once."""
    allowed = principal.tenant.models if principal.tenant else None
    names = dict.fromkeys(m.name for m in services.settings.models)
    return [name for name in names if allowed is None or name in allowed]


@router.get("/v1/models/{model_id:path}")
@router.get("/models/{model_id:path}", include_in_schema=False)
async def retrieve_model(model_id: str, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    """One model name the caller may use."""
    check_model_name(model_id, principal, services)
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "context-gateway"}


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def list_models(principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "context-gateway"}
            for name in model_names(principal, services)]
    return {"object": "list", "data": data}
