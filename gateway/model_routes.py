"""The model routes: each one translates its wire format and hands the request to the pipeline."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway import pipeline
from gateway.services import PrincipalDep, ServicesDep
from gateway.wire.anthropic_messages import ANTHROPIC_MESSAGES
from gateway.wire.openai_chat import OPENAI_CHAT

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


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def list_models(principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    allowed = principal.tenant.models if principal.tenant else None
    data = [
        {"id": m.name, "object": "model", "created": 0, "owned_by": "context-gateway"}
        for m in services.settings.models
        if allowed is None or m.name in allowed
    ]
    return {"object": "list", "data": data}
