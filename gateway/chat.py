"""`POST /v1/chat/completions` and `GET /v1/models`: the request path.

authenticate -> read and check the body -> ingest (durable) -> project ->
forward through the upstream client -> record the run.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from gateway import forwarding, outcomes
from gateway.auth import Principal
from gateway.chat_request import ChatRequest, parse_chat_request
from gateway.config import ModelSettings
from gateway.forwarding import Conversation
from gateway.outcomes import Accounting
from gateway.errors import GatewayError, InvalidRequest, ModelNotFound, PermissionDenied, RateLimitExceeded
from gateway.projection import assembly_record, project
from gateway.rehydration import Rehydrator, tool_schema
from gateway.request_id import request_id_of
from gateway.services import PrincipalDep, Services, ServicesDep
from gateway.streaming import SSE_DONE, StreamAccumulator, sse_event
from gateway.upstream import UpstreamRequest
from policies.assembler import Projection, Records
from policies.policy import Policy
from policies.transcript import message_path
from storage.record_types import AssemblyRecord, RunOutcome, RunStart

log = logging.getLogger("gateway.chat")
router = APIRouter()

SESSION_HEADERS = ("x-gateway-session", "x-litellm-session-id", "helicone-session-id")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused once it passes `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise InvalidRequest(
            f"the request body is {declared} bytes; the limit is {limit}", code="request_too_large"
        )
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise InvalidRequest(
                f"the request body passes the limit of {limit} bytes", code="request_too_large"
            )
        parts.append(chunk)
    return b"".join(parts)


async def _check_limit(services: Services, tenant: str, kind: str, amount: int, limit: int | None) -> dict[str, str]:
    """Count `amount` against the tenant's per-minute limit; 429 past it. Returns OpenAI-style headers."""
    if limit is None:
        return {}
    verdict = await services.limiter.hit(f"{tenant}:{kind}", amount, limit)
    headers = {
        f"x-ratelimit-limit-{kind}": str(verdict.limit),
        f"x-ratelimit-remaining-{kind}": str(verdict.remaining),
        f"x-ratelimit-reset-{kind}": f"{verdict.reset_seconds}s",
    }
    if not verdict.allowed:
        raise RateLimitExceeded(
            f"Rate limit reached for tenant '{tenant}': {limit} {kind} per minute. Try again in "
            f"{verdict.reset_seconds}s.", headers={"retry-after": str(verdict.reset_seconds), **headers},
        )
    return headers


async def _finish(services: Services, run: RunStart, outcome: RunOutcome, assembly: AssemblyRecord | None) -> None:
    """Record how the run ended (durably) and count it."""
    await run_in_threadpool(services.store.finish_run, run.request_id, outcome, assembly)
    services.metrics.observe_run(run.tenant, run.model, outcome, assembly)


_PARENT_REQUEST = re.compile(r"^req_[0-9a-f]{32}$")


def _header(request: Request, name: str, limit: int = 256) -> str | None:
    value = request.headers.get(name)
    if value is not None and (not value.strip() or len(value) > limit):
        raise InvalidRequest(f"header {name}: 1 to {limit} characters", param=name, code="invalid_header")
    return value


def _run_start(request: Request, principal: Principal, chat: ChatRequest, model: ModelSettings) -> RunStart:
    """What the request says about the run: who asks, for which model, in which session."""
    assert principal.tenant is not None
    parent = _header(request, "x-gateway-parent-request", 64)
    if parent is not None and not _PARENT_REQUEST.match(parent):
        raise InvalidRequest("header x-gateway-parent-request: a request id as in x-gateway-request-id (req_...)",
                             param="x-gateway-parent-request", code="invalid_header")
    labels = [_header(request, name) for name in SESSION_HEADERS]
    return RunStart(
        request_id=request_id_of(request),
        tenant=principal.tenant.id,
        participant=_header(request, "x-gateway-participant") or principal.key_id,
        model=chat.model,
        upstream_model=str(model.litellm_params["model"]),
        stream=chat.stream,
        session_label=next((label for label in labels if label), None),
        parent_request_id=parent,
    )


def _conversation(
    services: Services,
    run: RunStart,
    chat: ChatRequest,
    model: ModelSettings,
    policy: Policy,
    projection: Projection,
    records: Records,
    assembly: AssemblyRecord,
) -> Conversation:
    """The upstream request: the projection, plus the rehydration tool when it names artifacts."""
    body = chat.upstream_body(projection.messages)
    rehydrator = None
    if projection.names_artifacts and chat.body.get("tools") and policy.rehydration.max_rounds > 0:
        rehydrator = Rehydrator(policy=policy, records=records, store=services.store, tenant=run.tenant,
                                participant=run.participant, provider=model.provider_name,
                                decisions=assembly.decisions)
        body["tools"] = [*chat.body["tools"], tool_schema(rehydrator.name)]
    request = UpstreamRequest(
        alias=chat.model,
        litellm_params=model.litellm_params,
        body=body,
        timeout_seconds=services.settings.server.upstream_timeout_seconds,
        request_id=run.request_id,
    )
    return Conversation(request=request, rehydrator=rehydrator)


@router.post("/v1/chat/completions")
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(request: Request, principal: PrincipalDep, services: ServicesDep) -> Any:
    settings = services.settings
    if principal.tenant is None:
        raise PermissionDenied("admin keys read records; model requests need a tenant key")
    tenant = principal.tenant
    chat = parse_chat_request(await read_body(request, settings.server.max_body_bytes))
    model = settings.model(chat.model)
    if model is None or (tenant.models is not None and chat.model not in tenant.models):
        raise ModelNotFound(
            f"The model '{chat.model}' does not exist or you do not have access to it.", param="model"
        )
    rate_headers = await _check_limit(services, tenant.id, "requests", 1, tenant.limits.requests_per_minute)
    run = _run_start(request, principal, chat, model)
    path = message_path(tenant.id, chat.messages)
    started = time.perf_counter()
    ingest = await run_in_threadpool(services.store.ingest, path, run)
    ingest_ms = (time.perf_counter() - started) * 1000
    policy = services.policies[tenant.id]
    try:
        projection, records = await run_in_threadpool(
            project, policy, model, path, ingest, services.clock(), run.participant
        )
    except GatewayError as error:
        await _finish(services, run, outcomes.failure(error, started), None)
        raise
    accounting = Accounting(
        prices=services.upstream.prices(model.litellm_params),
        tokens_original=projection.tokens_original,
        tokens_forwarded=projection.tokens_forwarded,
        previous_original=ingest.previous_original_tokens,
    )
    assembly = assembly_record(projection, {"ingest": round(ingest_ms, 3)}, run.parent_request_id)
    try:
        rate_headers |= await _check_limit(services, tenant.id, "tokens", projection.tokens_forwarded,
                                           tenant.limits.tokens_per_minute)
    except GatewayError as error:
        await _finish(services, run, outcomes.failure(error, started, accounting), assembly)
        raise
    headers = {
        "x-gateway-tokens-original": str(projection.tokens_original),
        "x-gateway-tokens-forwarded": str(projection.tokens_forwarded),
        **rate_headers,
    }
    conversation = _conversation(services, run, chat, model, policy, projection, records, assembly)
    started = time.perf_counter()
    if chat.stream:
        return await _stream(services, run, chat, conversation, assembly, accounting, headers, started)
    try:
        response = await forwarding.complete(services.upstream, conversation)
    except GatewayError as error:
        await _finish(services, run, outcomes.failure(error, started, accounting), assembly)
        raise
    outcome = outcomes.success(response, started, accounting)
    await _finish(services, run, outcome, assembly)
    return JSONResponse(response, headers=headers)


async def _stream(
    services: Services,
    run: RunStart,
    chat: ChatRequest,
    conversation: Conversation,
    assembly: AssemblyRecord,
    accounting: Accounting,
    headers: dict[str, str],
    started: float,
) -> StreamingResponse:
    first_round = services.upstream.stream(conversation.request).__aiter__()
    try:  # an error before the first chunk is an ordinary HTTP error
        first = await first_round.__anext__()
    except StopAsyncIteration:
        first = None
    except GatewayError as error:
        await _finish(services, run, outcomes.failure(error, started, accounting), assembly)
        raise

    async def replayed_first_round() -> AsyncIterator[dict[str, Any]]:
        if first is not None:
            yield first
            async for chunk in first_round:
                yield chunk

    async def events() -> AsyncIterator[bytes]:
        accumulator = StreamAccumulator()
        outcome: RunOutcome | None = None
        try:
            async for chunk, is_usage in forwarding.stream(services.upstream, conversation, replayed_first_round()):
                if is_usage:
                    chunk = {"id": accumulator.id, "created": accumulator.created, "model": accumulator.model, **chunk}
                    accumulator.add(chunk)
                    if chat.wants_stream_usage:
                        yield sse_event(chunk)
                    continue
                accumulator.add(chunk)
                yield sse_event(chunk)
            yield SSE_DONE
            outcome = outcomes.success(accumulator.response(), started, accounting)
        except GatewayError as error:
            outcome = outcomes.failure(error, started, accounting)
            yield sse_event(error.body())
        except (asyncio.CancelledError, GeneratorExit):
            outcome = outcomes.failure(
                GatewayError("the client closed the stream", code="client_disconnected"),
                started,
                accounting,
                status="client_disconnected",
            )
            raise
        finally:
            if outcome is not None:
                await asyncio.shield(_finish(services, run, outcome, assembly))

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no", **headers},
    )


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
