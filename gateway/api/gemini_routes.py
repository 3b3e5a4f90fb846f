"""Google's Gemini API routes: `POST /v1beta/models/{model}:{method}` and the model list.

`generateContent`, `streamGenerateContent` (`?alt=sse` for server-sent events, as
Gemini CLI and Google's SDKs ask; without it, Google's JSON-array stream) and
`countTokens` hand the request to the pipeline in the Gemini wire format made for
that model and method. `/v1/models/{model}:{method}` (Google's stable version) is
the same. The tenant's key comes as `x-goog-api-key`, `?key=` or a bearer header
(gateway/pipeline/request_path.py `tenant_principal`); errors are Google's shape
(gateway/wire/formats.py picks it by path).
"""
from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.model_routes import check_model_name, model_names
from gateway.errors import InvalidRequest, ModelNotFound, NotFound
from gateway.pipeline import request_path as pipeline
from gateway.services import PrincipalDep, ServicesDep
from gateway.wire.gemini import GEMINI

router = APIRouter()

_MODEL = re.compile(r"[A-Za-z0-9._-]{1,256}")
_METHODS = ("generateContent", "streamGenerateContent", "countTokens")


def _split(target: str) -> tuple[str, str]:
    """(model, method) from the path's last segment, `{model}:{method}`."""
    model, _, method = target.rpartition(":")
    if method not in _METHODS:
        raise NotFound(f"Unknown method '{method}': this gateway serves {', '.join(_METHODS)}.",
                       code="unknown_url")
    return _plain_name(model), method


def _plain_name(model: str) -> str:
    """A model name as it may stand in a path (what a wildcard may take), or ModelNotFound."""
    if not _MODEL.fullmatch(model) or ".." in model:
        raise ModelNotFound(f"The model '{model}' does not exist or you do not have access to it.", param="model")
    return model


def _sse(request: Request) -> bool:
    alt = request.query_params.get("alt")
    if alt not in (None, "sse", "json"):
        raise InvalidRequest("alt: 'sse' or 'json'", param="alt")
    return alt == "sse"


@router.post("/v1beta/models/{target}")
@router.post("/v1/models/{target}", include_in_schema=False)
async def model_method(target: str, request: Request, services: ServicesDep) -> Any:
    model, method = _split(target)
    if method == "countTokens":
        return {"totalTokens": await pipeline.count_tokens(request, services, GEMINI.call(model, False, True))}
    stream = method == "streamGenerateContent"
    response: Response = await pipeline.handle(request, services, GEMINI.call(model, stream, _sse(request)))
    return response


def _model_entry(name: str) -> dict[str, Any]:
    return {"name": f"models/{name}", "baseModelId": name, "version": "context-gateway", "displayName": name,
            "supportedGenerationMethods": list(_METHODS)}


@router.get("/v1beta/models")
async def list_models(principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    """The model names the caller may use, in Google's list shape (wildcard entries by their pattern)."""
    return {"models": [_model_entry(name) for name in model_names(principal, services)]}


@router.get("/v1beta/models/{model}")
async def get_model(model: str, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    check_model_name(_plain_name(model), principal, services)
    return _model_entry(model)
