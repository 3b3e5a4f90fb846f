"""The request path, the same for every wire format.

authenticate -> read and parse the body (the wire format) -> check model,
limits and budgets -> ingest (durable; opens the run) -> project -> forward through the
upstream client -> answer in the wire format. From ingest on, a `RunRecorder`
records how the run ended, whatever the exit.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Callable, Mapping, Protocol, Sequence

from fastapi import Request
from fastapi.responses import Response

from gateway.access.auth import Principal, api_key_beside_bearer, authenticate_async
from gateway.config import ModelSettings, TenantSettings
from gateway.edge.request_id import request_id_of
from gateway.evaluation.arms import PROJECTED, arm_for, arm_policy, shadowed
from gateway.evaluation.shadows import ShadowJob
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    PermissionDenied,
    RateLimitExceeded,
)
from gateway.exchange import DIALECTS, Exchange, Relay, complete
from gateway.pipeline.compaction import compactor_for
from gateway.pipeline.compaction_refs import expanded
from gateway.pipeline.continuation import continued
from gateway.pipeline.outcomes import Accounting, offline_deployment
from gateway.pipeline.projection import assembly_record, project, projected_tokens
from gateway.pipeline.rehydration import DESCRIPTION, PARAMETERS, Rehydrator
from gateway.pipeline.run_recorder import RecordedAnswer, RecordedStream, RunRecorder
from gateway.services import Services
from gateway.threads import off_loop
from gateway.upstream.seam import Attempt, UpstreamClient, UpstreamRequest, closing
from gateway.wire import NeutralRequest, WireFormat
from gateway.wire.json_body import check_text
from policies.assembly_types import Projection, Records
from policies.policy import Policy
from policies.transcript import PathNode, message_path
from storage.assembly_record import AssemblyRecord
from storage.record_types import IngestResult, RunStart, UnknownParentRequest, UnstorableValue

SESSION_HEADERS = ("x-gateway-session", "x-litellm-session-id", "helicone-session-id", "x-claude-code-session-id")
PARENT_HEADER = "x-gateway-parent-request"
_PARENT_REQUEST = re.compile(r"^req_[0-9a-f]{32}$")
_OFF_LOOP_BYTES = 32 * 1024  # bodies past this are parsed and hashed in a worker thread, off the event loop
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")  # the client's, sent on to the provider


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


async def check_limits(services: Services, principal: Principal, kind: str, amount: int) -> dict[str, str]:
    """Count `amount` against the tenant's per-minute limit of `kind` (requests, tokens), then against
    the key's (a key made through the API may have its own); 429 past either. Returns OpenAI-style
    headers, the key's where both apply."""
    assert principal.tenant is not None
    field = f"{kind}_per_minute"
    headers = await check_limit(services, principal.tenant.id, f"tenant '{principal.tenant.id}'", kind, amount,
                                getattr(principal.tenant.limits, field))
    key_limits = principal.key_limits
    if key_limits is not None:
        headers |= await check_limit(services, f"key:{principal.key_id}", f"API key '{principal.key_id}'", kind,
                                     amount, getattr(key_limits, field))
    return headers


async def check_limit(services: Services, subject: str, who: str, kind: str, amount: int,
                      limit: int | None) -> dict[str, str]:
    """Count `amount` against one per-minute limit; 429 past it. Returns OpenAI-style headers."""
    if limit is None:
        return {}
    verdict = await services.limiter.hit(f"{subject}:{kind}", amount, limit)
    headers = {
        f"x-ratelimit-limit-{kind}": str(verdict.limit),
        f"x-ratelimit-remaining-{kind}": str(verdict.remaining),
        f"x-ratelimit-reset-{kind}": f"{verdict.reset_seconds}s",
    }
    if not verdict.allowed:
        raise RateLimitExceeded(
            f"Rate limit reached for {who}: {limit} {kind} per minute. Try again in "
            f"{verdict.reset_seconds}s.", headers={"retry-after": str(verdict.reset_seconds), **headers},
        )
    return headers


def header_value(request: Request, name: str, limit: int = 256) -> str | None:
    value = request.headers.get(name)
    if value is not None and (not value.strip() or len(value) > limit):
        raise InvalidRequest(f"header {name}: 1 to {limit} characters", param=name, code="invalid_header")
    return check_text(value, name) if value is not None else None


def _run_start(request: Request, principal: Principal, neutral: NeutralRequest, model: ModelSettings,
               wire: WireFormat, redact: Callable[[Any], tuple[Any, Mapping[str, int]]] | None = None) -> RunStart:
    """What the request says about the run: who asks, for which model, in which session."""
    assert principal.tenant is not None
    parent = header_value(request, PARENT_HEADER, 64)
    if parent is not None and not _PARENT_REQUEST.match(parent):
        raise InvalidRequest(f"header {PARENT_HEADER}: a request id as in x-gateway-request-id (req_...)",
                             param=PARENT_HEADER, code="invalid_header")
    labels = [header_value(request, name) for name in SESSION_HEADERS]
    return RunStart(
        request_id=request_id_of(request),
        tenant=principal.tenant.id,
        participant=header_value(request, "x-gateway-participant") or principal.key_id,
        model=neutral.model,
        upstream_model=str(model.litellm_params["model"]),
        stream=neutral.stream,
        session_label=next((label for label in labels if label), None),
        parent_request_id=parent,
        wire_format=wire.name,
        api_key_id=principal.key_id,
        redact=redact,
    )


def model_for(services: Services, tenant: TenantSettings, name: str) -> ModelSettings:
    model = services.settings.model(name)  # an exact name, or a wildcard entry (its name is the pattern)
    if model is None or (tenant.models is not None and model.name not in tenant.models):
        raise ModelNotFound(f"The model '{name}' does not exist or you do not have access to it.", param="model")
    return model


def _exchange(services: Services, run: RunStart, request: Request, neutral: NeutralRequest,
              wire: WireFormat, model: ModelSettings, policy: Policy, projection: Projection,
              records: Records, assembly: AssemblyRecord, previous_end: int | None,
              attempts: list[Attempt], models_allowed: frozenset[str] | None,
              midway: dict[str, Any] | None) -> Exchange:
    """The upstream request: the projection, plus the rehydration tool (when the client sends tools and
    the policy compacts).

    On a native Anthropic deployment the tool is added mid-conversation, right after the first message
    that names an artifact (gateway/pipeline/tool_additions.py): the prefix before it stays cached, and a
    conversation that names none declares nothing. Elsewhere it is declared in `tools` from a
    conversation's first request on, not from the first compaction: the tool list opens the prompt, and
    adding to it later makes the provider's prompt cache miss everything once (measured with
    bench/format_replay.py: up to 1.3x the client's own cost on a short trace, against at most 1.06x
    declared from the start).
    """
    stable = _stable_ends(policy, projection, previous_end)
    rehydrator = None
    if _offers_rehydration(policy, neutral):
        rehydrator = Rehydrator(policy=policy, records=records, store=services.store, tenant=run.tenant,
                                participant=run.participant, provider=model.provider_name,
                                rehydrations=assembly.rehydrations)
    if midway is not None and projection.aligned:
        first = projection.first_reference
        body = wire.upstream_body(neutral, projection.messages, stable,
                                  addition=(midway, first) if first is not None else None)
    else:
        body = wire.upstream_body(neutral, projection.messages, stable)
        if rehydrator is not None:
            body["tools"] = [*(neutral.tools or []), wire.rehydration_tool(rehydrator.name, DESCRIPTION, PARAMETERS)]
    upstream_request = UpstreamRequest(
        alias=neutral.model,
        litellm_params=model.litellm_params,
        body=body,
        timeout_seconds=services.settings.server.upstream_timeout_seconds,
        request_id=run.request_id,
        extra_headers={name: value for name in FORWARDED_HEADERS if (value := request.headers.get(name))},
        models_allowed=models_allowed,
        tokens=projection.tokens_forwarded,
        attempts=attempts,
        client_digests=_as_sent_digests(neutral, projection),
    )
    return Exchange(dialect=DIALECTS[wire.upstream], request=upstream_request, rehydrator=rehydrator,
                    client=neutral, tracing=services.tracing)


def _as_sent_digests(neutral: NeutralRequest, projection: Projection) -> list[bytes | None] | None:
    """The parse's digest of each forwarded message that is the client's as it came (None for the others),
    when every place was kept: the direct transport's memo knows those messages by it."""
    digests, as_sent = neutral.digests, projection.as_sent
    if digests is None or len(as_sent) != len(digests):
        return None
    return [digest if same else None for digest, same in zip(digests, as_sent)]


def _offers_rehydration(policy: Policy, neutral: NeutralRequest) -> bool:
    """The rehydration tool is offered when the client sends tools and the policy compacts."""
    return bool(neutral.tools) and policy.enabled and policy.rehydration.max_rounds > 0


def _midway_tool(wire: WireFormat, policy: Policy, model: ModelSettings, neutral: NeutralRequest
                 ) -> dict[str, Any] | None:
    """The rehydration tool when an Anthropic Messages request adds it where the first memory appears
    (gateway/pipeline/tool_additions.py) rather than declaring it in `tools`: to a native Anthropic deployment,
    when the policy allows."""
    if not (wire.adds_tools_midway and _offers_rehydration(policy, neutral)
            and policy.rehydration.mid_conversation and model.provider_name == "anthropic"):
        return None
    return wire.rehydration_tool(policy.rehydration.tool_name, DESCRIPTION, PARAMETERS)


def assembly_attributes(path: Sequence[Any], projection: Projection) -> dict[str, Any]:
    """The `gateway.assembly` span's account: messages and tokens as the client sent them and as forwarded."""
    actions: dict[str, int] = {}
    for decision in projection.decisions:
        actions[decision.action] = actions.get(decision.action, 0) + 1
    return {"gateway.assembly.messages_in": len(path), "gateway.assembly.messages_out": len(projection.messages),
            "gateway.tokens.sent": projection.tokens_original, "gateway.tokens.forwarded": projection.tokens_forwarded,
            **{f"gateway.assembly.{action}": count for action, count in sorted(actions.items()) if action != "verbatim"}}


def _stable_ends(policy: Policy, projection: Projection, previous_end: int | None) -> list[int]:
    """Where the forwarded bytes stay the same on later requests, most needed first (for cache markers):
    the end of this request (the next one extends it); the message before the first one the next move
    is expected to change (so the move reads everything before it from the cache); the end of the
    assistant turn that the latest tool results answer (everything before those results stays when a
    move compacts them); the epoch boundary (stays until the boundary moves); the end of the previous
    request (which the provider's 20-block lookback from the first marker usually finds anyway).

    When the next request is expected to make that move (`Projection.next_move_due`), nothing after the
    message before it is marked but the end of the previous request (which this request reads): the
    provider charges the cache write price (1.25x) for every token up to the last marker, and the move
    rewrites what follows, so those tokens would be written and never read; after the last marker they
    cost the plain input price."""
    if not policy.cache_markers:
        return []
    messages = projection.messages
    last = len(messages) - 1
    if not projection.aligned:
        return [last]
    asked = last
    while asked >= 0 and messages[asked].get("role") == "tool":
        asked -= 1
    ends = [last]
    foreseen = projection.next_move_from - 1 if projection.next_move_from is not None else None
    for end in (foreseen, asked if asked < last else None, projection.boundary_index, previous_end):
        if end is not None and 0 <= end < len(messages) and end not in ends:
            ends.append(end)
    if projection.next_move_due and foreseen is not None:
        ends = [end for end in ends if end <= foreseen or end == previous_end]
    return ends


def _path(services: Services, tenant: str, neutral: NeutralRequest) -> list[PathNode]:
    """The request's messages placed in the tenant's tree, by the node-id cache, with the digests parsing
    worked out (none are computed twice)."""
    if neutral.digests is None:
        return message_path(tenant, neutral.messages, ids=services.node_ids)
    return services.node_ids.path(tenant, neutral.messages, neutral.digests)


@dataclass
class Prepared:
    """A request captured and projected: what forwarding it needs. `policy` is the one it was projected
    under (the held-out arm's is the tenant's with the projection off); `midway` the rehydration tool when
    it is added where the first memory appears."""

    ingest: IngestResult
    projection: Projection
    records: Records
    record: AssemblyRecord
    policy: Policy
    midway: dict[str, Any] | None


def _capture_and_project(services: Services, recorder: RunRecorder, policy: Policy, model: ModelSettings,
                         tenant: str, neutral: NeutralRequest, wire: WireFormat) -> Prepared:
    """The request's path in the tenant's tree, its conversation's evaluation arm (gateway/evaluation/arms.py),
    the path captured (the run opens), and its projection with the record of its assembly; on a worker
    thread, in one trip. Formats that place cache markers foresee the next move (markers go before the
    message it is expected to change)."""
    run = recorder.start
    path = _path(services, tenant, neutral)
    arm = arm_for(policy, tenant, run.session_label, path, run.request_id)
    run = recorder.start = replace(run, evaluation_arm=arm, policy_version=policy.version_label)
    policy = arm_policy(policy, arm)
    midway = _midway_tool(wire, policy, model, neutral)
    started = time.perf_counter()
    with services.tracing.span("gateway.ingest", {"gateway.ingest.messages": len(path)}) as span:
        try:
            ingest = recorder.ingest_here(path)
        except UnknownParentRequest as exc:
            raise InvalidRequest(f"header {PARENT_HEADER}: no request '{run.parent_request_id}' of this tenant",
                                 param=PARENT_HEADER, code="invalid_header") from exc
        except UnstorableValue as exc:
            raise InvalidRequest(f"a value in the request cannot be stored: {exc}", code="invalid_value") from exc
        span.set_attributes({"gateway.ingest.messages_captured": len(ingest.new_node_ids),
                             "gateway.ingest.artifacts_captured": len(ingest.new_artifact_ids)})
    ingest_ms = (time.perf_counter() - started) * 1000
    with services.tracing.span("gateway.assembly", {"gateway.policy.name": policy.name,
                                                    "gateway.policy.version": policy.version,
                                                    "gateway.evaluation.arm": arm}) as span:
        projection, records, assembly_ms = project(policy, model, path, ingest, services.clock(), run.participant,
                                                   added_tool=midway, foresee=wire.marks_cache and policy.cache_markers)
        if span.is_recording():
            span.set_attributes(assembly_attributes(path, projection))
    timings = {"ingest": round(ingest_ms, 3), "assemble": round(assembly_ms, 3)}
    record = assembly_record(projection, timings, run.parent_request_id, [n.message for n in path],
                             context_edits=neutral.context_edits)
    return Prepared(ingest, projection, records, record, policy, midway)


async def _parse(wire: WireFormat, raw: bytes, max_messages: int) -> NeutralRequest:
    if len(raw) > _OFF_LOOP_BYTES:
        return await off_loop(wire.parse, raw, max_messages)
    return wire.parse(raw, max_messages)


async def tenant_principal(request: Request, services: Services) -> Principal:
    principal = await authenticate_async(services.keyring, request.headers.get("authorization"),
                                         api_key_beside_bearer(request.headers, request.url.path,
                                                               request.query_params))
    if principal.tenant is None:
        raise PermissionDenied("admin keys read records; model requests need a tenant key")
    return principal


class CountsTokens(WireFormat, Protocol):
    def parse_count(self, raw: bytes, max_messages: int | None = None) -> NeutralRequest:
        """A token-count request's body (no max_tokens needed, nothing forwarded)."""


async def count_tokens(request: Request, services: Services, wire: CountsTokens) -> int:
    """Tokens of what would be forwarded: the projection of the request's transcript (nothing is stored)."""
    principal = await tenant_principal(request, services)
    assert principal.tenant is not None
    raw = await read_body(request, services.settings.server.max_body_bytes)
    neutral = await off_loop(wire.parse_count, raw, services.settings.server.max_messages)
    model = model_for(services, principal.tenant, neutral.model)
    policy = services.policies[principal.tenant.id]
    return await off_loop(projected_tokens, policy, model, principal.tenant.id, neutral, services.clock())


async def handle(request: Request, services: Services, wire: WireFormat) -> Response:
    """One model request in `wire`'s format, answered in it."""
    principal = await tenant_principal(request, services)
    tenant = principal.tenant
    assert tenant is not None
    raw = await read_body(request, services.settings.server.max_body_bytes)
    neutral = await _parse(wire, raw, services.settings.server.max_messages)
    model = model_for(services, tenant, neutral.model)
    rate_headers = await check_limits(services, principal, "requests", 1)
    await services.budgets.check(principal)
    if neutral.previous_response_id is not None:
        neutral = await continued(services, tenant.id, neutral)
    neutral = await expanded(services, tenant.id, neutral)  # the gateway's own compaction items, made transcripts
    policy = tenant_policy = services.policies[tenant.id]  # one policy for the whole request, from capture on
    run = _run_start(request, principal, neutral, model, wire, redact=policy.redaction.on_capture)
    recorder = RunRecorder(services.store, services.metrics, run, request.scope, services.recent_assemblies,
                           services.budgets, answer_of=wire.answer_message)
    recorder.transcript = neutral.messages  # its outcome signals are read from it (gateway/evaluation/signals.py)
    async with recorder:
        # One trip to a worker thread: placing the messages, capturing them, assembling the projection.
        prepared = await off_loop(_capture_and_project, services, recorder, policy, model, tenant.id, neutral, wire)
        ingest, projection, records, record = prepared.ingest, prepared.projection, prepared.records, prepared.record
        policy, midway = prepared.policy, prepared.midway
        recorder.accounting = Accounting(
            prices=services.upstream.prices(model.litellm_params),
            tokens_original=projection.tokens_original,
            tokens_forwarded=projection.tokens_forwarded,
            previous_original=ingest.previous_original_tokens,
            offline=offline_deployment(model.litellm_params),
        )
        assembly = services.recent_assemblies.based(record, ingest.previous_request_id)
        recorder.assembly = assembly
        rate_headers |= await check_limits(services, principal, "tokens", projection.tokens_forwarded)
        headers = {
            "x-gateway-tokens-original": str(projection.tokens_original),
            "x-gateway-tokens-forwarded": str(projection.tokens_forwarded),
            **rate_headers,
        }
        exchange = _exchange(services, run, request, neutral, wire, model, policy, projection, records, assembly,
                             ingest.previous_leaf_position, recorder.attempts, tenant.allowed_models, midway)
        _shadow_when_picked(services, recorder, tenant_policy, wire, neutral, exchange)
        upstream = compactor_for(services, run, ingest.conversation_id, neutral, model.provider_name,
                                 projection) or services.upstream  # a remote compaction: forwarded, or answered
        recorder.forwarding()
        if neutral.stream:
            return await _stream(services, upstream, exchange, recorder, headers)
        completion = await complete(upstream, exchange)
        return RecordedAnswer(completion.body, recorder, recorder.success(completion), headers)


def _shadow_when_picked(services: Services, recorder: RunRecorder, policy: Policy, wire: WireFormat,
                        neutral: NeutralRequest, exchange: Exchange) -> None:
    """A projected request the policy's `evaluation.shadow_share` picks is sent again unprojected once its
    client has the answer (gateway/evaluation/shadows.py)."""
    run, shadows, accounting = recorder.start, services.shadows, recorder.accounting
    if shadows is None or accounting is None or run.evaluation_arm != PROJECTED or neutral.compaction is not None \
            or not shadowed(policy, run.request_id):
        return
    job = ShadowJob(tenant=run.tenant, request_id=run.request_id,
                    budget_usd=policy.evaluation.shadow_budget_usd_per_day, wire=wire, client=neutral,
                    request=exchange.request,
                    accounting=replace(accounting, tokens_forwarded=accounting.tokens_original))
    recorder.on_answered = lambda outcome, answer: shadows.start(job, answer, outcome.cost_original_usd)


async def _stream(services: Services, upstream: UpstreamClient, exchange: Exchange, recorder: RunRecorder,
                  headers: dict[str, str]) -> Response:
    relay = Relay(upstream, exchange)
    await relay.start()  # an error before the first event is an ordinary HTTP error

    async def events() -> AsyncIterator[bytes]:
        try:
            async with closing(relay.events()) as frames:
                async for data in frames:
                    yield data
            outcome = recorder.success(relay.completion)
            yield relay.terminal()  # the client has everything before the store is written
            await recorder.finish(outcome)
        except GatewayError as error:
            await recorder.fail(error)
            yield relay.error(error)
        except Exception as exc:  # a fault of ours mid-stream: recorded, and told in the stream's own terms
            error = await recorder.fail_internally(exc)
            services.metrics.observe_error(error.code or error.error_type, "/v1/")
            yield relay.error(error)

    return RecordedStream(events(), recorder, headers, close=relay.aclose, media_type=relay.media_type)
