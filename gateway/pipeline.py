"""The request path, the same for every wire format.

authenticate -> read and parse the body (the wire format) -> check model and
limits -> ingest (durable; opens the run) -> project -> forward through the
upstream client -> answer in the wire format. From ingest on, a `RunRecorder`
records how the run ended, whatever the exit.
"""
from __future__ import annotations

import re
import time
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from gateway import forwarding
from gateway.auth import Principal, authenticate
from gateway.config import ModelSettings, TenantSettings
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    PermissionDenied,
    RateLimitExceeded,
)
from gateway.forwarding import Conversation
from gateway.outcomes import Accounting
from gateway.projection import assembly_record, project
from gateway.rehydration import Rehydrator, tool_schema
from gateway.request_id import request_id_of
from gateway.run_recorder import RecordedStream, RunRecorder, internal_error
from gateway.services import Services
from gateway.streaming import StreamAccumulator
from gateway.upstream import UpstreamRequest
from gateway.wire import NeutralRequest, WireFormat
from gateway.wire.json_body import check_text
from policies.assembler import Projection, Records
from policies.policy import Policy
from policies.transcript import message_path
from storage.record_types import AssemblyRecord, RunStart, UnknownParentRequest

SESSION_HEADERS = ("x-gateway-session", "x-litellm-session-id", "helicone-session-id", "x-claude-code-session-id")
PARENT_HEADER = "x-gateway-parent-request"
_PARENT_REQUEST = re.compile(r"^req_[0-9a-f]{32}$")
_OFF_LOOP_BYTES = 256 * 1024  # bodies past this are parsed and hashed in a worker thread


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


async def check_limit(services: Services, tenant: str, kind: str, amount: int, limit: int | None) -> dict[str, str]:
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


def _header(request: Request, name: str, limit: int = 256) -> str | None:
    value = request.headers.get(name)
    if value is not None and (not value.strip() or len(value) > limit):
        raise InvalidRequest(f"header {name}: 1 to {limit} characters", param=name, code="invalid_header")
    return check_text(value, name) if value is not None else None


def _run_start(request: Request, principal: Principal, neutral: NeutralRequest, model: ModelSettings,
               wire: WireFormat) -> RunStart:
    """What the request says about the run: who asks, for which model, in which session."""
    assert principal.tenant is not None
    parent = _header(request, PARENT_HEADER, 64)
    if parent is not None and not _PARENT_REQUEST.match(parent):
        raise InvalidRequest(f"header {PARENT_HEADER}: a request id as in x-gateway-request-id (req_...)",
                             param=PARENT_HEADER, code="invalid_header")
    labels = [_header(request, name) for name in SESSION_HEADERS]
    return RunStart(
        request_id=request_id_of(request),
        tenant=principal.tenant.id,
        participant=_header(request, "x-gateway-participant") or principal.key_id,
        model=neutral.model,
        upstream_model=str(model.litellm_params["model"]),
        stream=neutral.stream,
        session_label=next((label for label in labels if label), None),
        parent_request_id=parent,
        wire_format=wire.name,
    )


def _model_for(services: Services, tenant: TenantSettings, name: str) -> ModelSettings:
    model = services.settings.model(name)
    if model is None or (tenant.models is not None and name not in tenant.models):
        raise ModelNotFound(f"The model '{name}' does not exist or you do not have access to it.", param="model")
    return model


def _conversation(services: Services, run: RunStart, neutral: NeutralRequest, model: ModelSettings,
                  policy: Policy, projection: Projection, records: Records,
                  assembly: AssemblyRecord) -> Conversation:
    """The upstream request: the projection, plus the rehydration tool when it names artifacts."""
    body = neutral.upstream_body(projection.messages)
    rehydrator = None
    if projection.names_artifacts and neutral.tools and policy.rehydration.max_rounds > 0:
        rehydrator = Rehydrator(policy=policy, records=records, store=services.store, tenant=run.tenant,
                                participant=run.participant, provider=model.provider_name,
                                decisions=assembly.decisions)
        body["tools"] = [*neutral.tools, tool_schema(rehydrator.name)]
    request = UpstreamRequest(
        alias=neutral.model,
        litellm_params=model.litellm_params,
        body=body,
        timeout_seconds=services.settings.server.upstream_timeout_seconds,
        request_id=run.request_id,
    )
    return Conversation(request=request, rehydrator=rehydrator)


async def _parse(wire: WireFormat, raw: bytes) -> NeutralRequest:
    if len(raw) > _OFF_LOOP_BYTES:
        return await run_in_threadpool(wire.parse, raw)
    return wire.parse(raw)


async def handle(request: Request, services: Services, wire: WireFormat) -> Response:
    """One model request in `wire`'s format, answered in it."""
    principal = authenticate(services.keyring, request.headers.get("authorization"), request.headers.get("x-api-key"))
    if principal.tenant is None:
        raise PermissionDenied("admin keys read records; model requests need a tenant key")
    tenant = principal.tenant
    raw = await read_body(request, services.settings.server.max_body_bytes)
    neutral = await _parse(wire, raw)
    model = _model_for(services, tenant, neutral.model)
    rate_headers = await check_limit(services, tenant.id, "requests", 1, tenant.limits.requests_per_minute)
    run = _run_start(request, principal, neutral, model, wire)
    if len(raw) > _OFF_LOOP_BYTES:
        path = await run_in_threadpool(message_path, tenant.id, neutral.messages)
    else:
        path = message_path(tenant.id, neutral.messages)
    recorder = RunRecorder(services.store, services.metrics, run, request.scope)
    async with recorder:
        started = time.perf_counter()
        try:
            ingest = await recorder.ingest(path)
        except UnknownParentRequest as exc:
            raise InvalidRequest(f"header {PARENT_HEADER}: no request '{run.parent_request_id}' of this tenant",
                                 param=PARENT_HEADER, code="invalid_header") from exc
        ingest_ms = (time.perf_counter() - started) * 1000
        policy = services.policies[tenant.id]
        projection, records, assembly_ms = await run_in_threadpool(
            project, policy, model, path, ingest, services.clock(), run.participant
        )
        recorder.accounting = Accounting(
            prices=services.upstream.prices(model.litellm_params),
            tokens_original=projection.tokens_original,
            tokens_forwarded=projection.tokens_forwarded,
            previous_original=ingest.previous_original_tokens,
        )
        timings = {"ingest": round(ingest_ms, 3), "assemble": round(assembly_ms, 3)}
        assembly = assembly_record(projection, timings, run.parent_request_id)
        recorder.assembly = assembly
        rate_headers |= await check_limit(services, tenant.id, "tokens", projection.tokens_forwarded,
                                          tenant.limits.tokens_per_minute)
        headers = {
            "x-gateway-tokens-original": str(projection.tokens_original),
            "x-gateway-tokens-forwarded": str(projection.tokens_forwarded),
            **rate_headers,
        }
        conversation = _conversation(services, run, neutral, model, policy, projection, records, assembly)
        recorder.forwarding()
        if neutral.stream:
            return await _stream(services, wire, neutral, conversation, recorder, headers)
        response = await forwarding.complete(services.upstream, conversation)
        await recorder.succeed(response)
        return JSONResponse(wire.response(response, neutral), headers=headers)


async def _stream(services: Services, wire: WireFormat, neutral: NeutralRequest, conversation: Conversation,
                  recorder: RunRecorder, headers: dict[str, str]) -> Response:
    first_round = services.upstream.stream(conversation.request).__aiter__()
    try:  # an error before the first chunk is an ordinary HTTP error
        first = await first_round.__anext__()
    except StopAsyncIteration:
        first = None

    async def replayed_first_round() -> AsyncIterator[dict[str, Any]]:
        if first is not None:
            yield first
            async for chunk in first_round:
                yield chunk

    renderer = wire.stream_renderer(neutral)

    async def events() -> AsyncIterator[bytes]:
        accumulator = StreamAccumulator()
        try:
            async for chunk, is_usage in forwarding.stream(services.upstream, conversation, replayed_first_round()):
                if is_usage:
                    chunk = {"id": accumulator.id, "created": accumulator.created, "model": accumulator.model, **chunk}
                    accumulator.add(chunk)
                    if data := renderer.usage(chunk):
                        yield data
                    continue
                accumulator.add(chunk)
                yield renderer.chunk(chunk)
            await recorder.succeed(accumulator.response())
            yield renderer.done()
        except GatewayError as error:
            await recorder.fail(error)
            yield renderer.error(error)
        except Exception as exc:  # a fault of ours mid-stream: recorded, and told in the stream's own terms
            error = internal_error(exc)
            await recorder.fail(error, status="internal_error")
            services.metrics.observe_error("internal_error")
            yield renderer.error(error)

    return RecordedStream(events(), recorder, headers)
