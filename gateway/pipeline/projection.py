"""Between ingest and forward: the tenant's policy applied to the request path."""
from __future__ import annotations

import itertools
import operator
import time
from typing import Any, Mapping

from gateway.config import ModelSettings
from gateway.errors import ContextBudgetExceeded
from gateway.pipeline.tool_additions import addition_message
from gateway.wire import NeutralRequest
from policies import assembly_types
from policies.assembler import assemble
from policies.assembly_types import Projection, Records
from policies.canonical import fast_canonical_json
from policies.path_records import path_tokens, records_for_path
from policies.policy import Policy
from policies.tokens import count_text, encoding_for_model
from policies.transcript import PathNode, canonical_json, message_path
from storage.assembly_record import AssemblyRecord
from storage.record_types import IngestResult


def project(
    policy: Policy,
    model: ModelSettings,
    path: list[PathNode],
    ingest: IngestResult,
    now: float,
    participant: str,
    added_tool: Mapping[str, Any] | None = None,
    foresee: bool = False,
) -> tuple[Projection, Records, float]:
    """The projection of `path` for `model` and `participant` under `policy` at `now`.

    `added_tool`: a tool added mid-conversation where the first memory appears
    (gateway/pipeline/tool_additions.py), so the first compaction must pay for it too. `foresee`: say where the
    next move is expected to start (for cache markers).
    Returns the records it was assembled from too (rehydration checks lineage
    against them), and the milliseconds the assembly took. Raises ContextBudgetExceeded.
    """
    encoding = encoding_for_model(str(model.litellm_params["model"]))
    records = records_for_path(
        path,
        now,
        observed_at=ingest.observed_at,
        owners=ingest.owners,
        sibling_artifacts=ingest.sibling_artifacts,
        subagent_results=ingest.subagent_results,
        rehydrated=ingest.rehydrated,
        encoding=encoding,
    )
    started = time.perf_counter()
    try:
        projection = assemble(policy, [n.message for n in path], records, now,
                              provider=model.provider_name, encoding=encoding, participant=participant,
                              first_move_tokens=_tokens_added(added_tool, encoding),
                              tokens=path_tokens(path, encoding), foresee=foresee, node_ids=[n.id for n in path])
    except assembly_types.ContextBudgetExceeded as exc:
        raise ContextBudgetExceeded(
            f"Context budget exceeded: {exc}. Shorten the conversation or raise budget.max_prompt_tokens.",
            param="messages",
        ) from exc
    return projection, records, (time.perf_counter() - started) * 1000


def _tokens_added(tool: Mapping[str, Any] | None, encoding: str) -> int:
    return count_text(canonical_json(addition_message(tool)), encoding) if tool is not None else 0


def projected_tokens(policy: Policy, model: ModelSettings, tenant: str, request: NeutralRequest, now: float) -> int:
    """The prompt tokens the gateway would forward for `request`: its projection, from the path alone
    (as `gateway replay` assembles), plus the tools it declares."""
    path = message_path(tenant, request.messages, fast_canonical_json)
    encoding = encoding_for_model(str(model.litellm_params["model"]))
    records = records_for_path(path, now, encoding=encoding)
    try:
        projection = assemble(policy, request.messages, records, now, provider=model.provider_name, encoding=encoding)
    except assembly_types.ContextBudgetExceeded as exc:
        raise ContextBudgetExceeded(f"Context budget exceeded: {exc}.", param="messages") from exc
    tools = request.tools
    return projection.tokens_forwarded + (count_text(canonical_json(tools), encoding) if tools else 0)


def replaced_messages(projection: Projection, messages: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """What the projection forwarded in place of a client's message, by the message's index. With every
    place kept, only the messages not forwarded as they came (`Projection.as_sent`) are looked at: at
    1,000 messages most are."""
    decisions, forwarded, as_sent = projection.decisions, projection.messages, projection.as_sent
    if len(as_sent) == len(forwarded) == len(decisions):
        return {i: forwarded[i] for i in itertools.compress(range(len(as_sent)), map(operator.not_, as_sent))
                if decisions[i].action != "verbatim" and forwarded[i] != messages[i]}
    kept = [d for d in decisions if d.action != "omitted"]
    return {d.index: sent for d, sent in zip(kept, forwarded)
            if d.action != "verbatim" and sent != messages[d.index]}


def assembly_record(
    projection: Projection, timings_ms: dict[str, float], parent_request_id: str | None = None,
    messages: list[dict[str, Any]] | None = None, context_edits: list[dict[str, Any]] | None = None,
) -> AssemblyRecord:
    return AssemblyRecord(
        policy_name=projection.policy_name,
        policy_version=projection.policy_version,
        assembler_version=projection.assembler_version,
        tokens_original=projection.tokens_original,
        tokens_forwarded=projection.tokens_forwarded,
        messages_original=len(projection.decisions),
        messages_forwarded=len(projection.messages),
        boundary_round=projection.boundary_round,
        epoch_round=projection.epoch_round,
        decided=projection.decisions,  # dicts made of the notable ones only (AssemblyRecord.notable)
        omissions=projection.omissions,
        timings_ms=timings_ms,
        parent_request_id=parent_request_id,
        replaced=replaced_messages(projection, messages) if messages is not None else None,
        provider_edits={"edits": context_edits, "applied_edits": None} if context_edits is not None else {},
    )
