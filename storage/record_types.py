"""The record store's values: what goes in (RunStart, RunOutcome; AssemblyRecord in
storage/assembly_record.py) and what comes out (IngestResult, ArtifactRecord, RunRecord), and their row
conversions.

Plain frozen dataclasses, so the gateway never handles ORM objects.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from storage.assembly_record import AssemblyRecord
from storage.encryption import EncryptionKeys, artifact_arguments_aad, run_error_aad, run_response_aad
from storage.schema import ModelRun, ToolArtifact


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class RunStart:
    """What is known of a model run before it is forwarded."""

    request_id: str
    tenant: str
    participant: str
    model: str
    upstream_model: str
    stream: bool
    session_label: str | None = None
    parent_request_id: str | None = None
    wire_format: str = "openai.chat"
    api_key_id: str | None = None  # the key's id or fingerprint, never the key
    started_at: datetime = field(default_factory=utcnow)
    # Applied to each new tool result's content before it is stored: (content, {kind: count}).
    # The policy decides (policies/policy.py, `redaction.stored`); None stores what was sent.
    redact: Callable[[Any], tuple[Any, Mapping[str, int]]] | None = None
    evaluation_arm: str | None = None  # "projected" | "holdout" (gateway/evaluation/arms.py)
    policy_version: str | None = None  # the tenant's policy, as evaluated (the same in both arms)


@dataclass(frozen=True)
class RunOutcome:
    """How a model run ended."""

    status: str  # ok | error | internal_error | client_disconnected | interrupted
    latency_ms: float
    http_status: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    total_tokens: int | None = None
    cost_usd: float | None = None
    cost_original_usd: float | None = None
    tokens_original: int | None = None
    tokens_forwarded: int | None = None
    cache_write_tokens: int | None = None
    finish_reason: str | None = None
    response: Mapping[str, Any] | None = None
    # Which deployment answered (or failed last), its model, and every upstream try in order.
    deployment: str | None = None
    upstream_model: str | None = None
    attempts: tuple[Mapping[str, Any], ...] = ()
    # The answer as its client will send it back (the neutral transcript's assistant message), given for
    # a run before any answer: it moves into the conversation this answer opens (storage/conversations.py).
    answer: Mapping[str, Any] | None = None
    # Outcome signals of an answer (gateway/evaluation/signals.py: answer_calls, repeated_calls, final_answer,
    # tool_results, tool_errors, rehydrations); None for a run that did not answer.
    signals: Mapping[str, int | bool] | None = None


@dataclass(frozen=True)
class IngestResult:
    tree_id: str  # the message tree's root (lineage)
    conversation_id: str  # the unit users see, count and delete
    new_node_ids: tuple[str, ...]
    new_artifact_ids: tuple[str, ...]
    path_artifact_ids: tuple[str, ...]
    observed_at: Mapping[str, float]  # artifact id -> unix seconds it was first captured
    owners: Mapping[str, str]  # artifact id -> participant that produced it
    sibling_artifacts: int  # artifacts of the conversation that are not on this path
    subagent_results: Mapping[str, str]  # sha256 -> tool name, of results captured by subagents of this conversation
    previous_original_tokens: int  # the client's transcript tokens on the latest earlier run on this path
    previous_leaf_position: int | None = None  # where that run's transcript ended in this one
    previous_request_id: str | None = None  # that run
    rehydrated: frozenset[str] = frozenset()  # artifacts of the path a model had back whole (rehydration tool)


@dataclass(frozen=True)
class ArtifactRecord:
    id: str
    tenant: str
    tree_id: str
    node_id: str
    tool_call_id: str
    tool_name: str | None
    arguments: str | None
    status: str
    sha256: str
    bytes: int
    tokens: int
    content_type: str
    owner_participant: str
    privacy_class: str | None
    freshness_class: str | None
    captured_by_request: str
    observed_at: datetime
    blob_key: str | None
    original_sha256: str | None = None
    redacted: Mapping[str, int] | None = None

    def metadata(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "tool_artifact",
            "tenant": self.tenant,
            "tree_id": self.tree_id,
            "session_id": self.tree_id,  # the tree's former name, kept for API clients
            "node_id": self.node_id,
            "tool_call_id": self.tool_call_id,
            "tool_name": self.tool_name,
            "arguments": self.arguments,
            "status": self.status,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "tokens": self.tokens,
            "content_type": self.content_type,
            "owner_participant": self.owner_participant,
            "privacy_class": self.privacy_class,
            "freshness_class": self.freshness_class,
            "captured_by_request": self.captured_by_request,
            "observed_at": self.observed_at.isoformat(),
            "storage": "blob" if self.blob_key else "inline",
            "redaction": {"original_sha256": self.original_sha256, "redacted": dict(self.redacted or {})}
            if self.original_sha256 else None,
        }


@dataclass(frozen=True)
class RunRecord:
    run: dict[str, Any]
    captured_artifacts: tuple[ArtifactRecord, ...]
    path_artifact_ids: tuple[str, ...]
    assembly: AssemblyRecord | None


class UnstorableValue(Exception):
    """A value the database refuses (too long for its column, a character it cannot hold): bad input
    that the wire format's checks let through. The gateway answers it as a 400, never a 500."""


class UnknownParentRequest(Exception):
    """A run names a parent request that is not its tenant's."""


class CapturedThenFailed(Exception):
    """The capture committed (the run is stored, pending) and what came after failed (the cause): the
    run is open, and its outcome is the caller's to record."""


class ArtifactCorrupted(Exception):
    """Stored artifact bytes no longer match their recorded sha256."""


def artifact_from_row(row: ToolArtifact, encryption: EncryptionKeys) -> ArtifactRecord:
    """The record of an artifact's row, its arguments opened (the content is read apart: `artifact_bytes`)."""
    return ArtifactRecord(
        id=row.id,
        tenant=row.tenant,
        tree_id=row.tree_id,
        node_id=row.node_id,
        tool_call_id=row.tool_call_id,
        tool_name=row.tool_name,
        arguments=encryption.open_text(row.arguments, artifact_arguments_aad(row.id), row.key_id),
        status=row.status,
        sha256=row.sha256,
        bytes=row.size_bytes,
        tokens=row.tokens,
        content_type=row.content_type,
        owner_participant=row.owner_participant,
        privacy_class=row.privacy_class,
        freshness_class=row.freshness_class,
        captured_by_request=row.captured_by_request,
        observed_at=as_utc(row.observed_at),
        blob_key=row.blob_key,
        original_sha256=row.original_sha256,
        redacted=json.loads(row.redacted_json) if row.redacted_json else None,
    )


def as_utc(moment: datetime) -> datetime:
    """SQLite hands datetimes back naive; they were stored as UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def run_as_dict(row: ModelRun, encryption: EncryptionKeys) -> dict[str, Any]:
    """The records API's view of a run's row, its answer and error message opened."""
    response = encryption.open_text(row.response_json, run_response_aad(row.id), row.key_id)
    error = encryption.open_text(row.error_message, run_error_aad(row.id), row.key_id)
    return {
        "id": row.id,
        "object": "model_run",
        "tenant": row.tenant,
        "tree_id": row.tree_id,
        "session_id": row.tree_id,  # the tree's former name, kept for API clients
        "session_label": row.session_label,
        "conversation_id": row.conversation_id,
        "participant": row.participant,
        "parent_request_id": row.parent_request_id,
        "model": row.model,
        "upstream_model": row.upstream_model,
        "deployment": row.deployment,
        "attempts": json.loads(row.attempts_json) if row.attempts_json else [],
        "leaf_node_id": row.leaf_node_id,
        "message_count": row.message_count,
        "stream": row.stream,
        "wire_format": row.wire_format,
        "api_key_id": row.api_key_id,
        "status": row.status,
        "http_status": row.http_status,
        "error": (
            {"type": row.error_type, "message": error} if row.error_type else None
        ),
        "usage": {
            "prompt_tokens": row.prompt_tokens,
            "completion_tokens": row.completion_tokens,
            "cached_tokens": row.cached_tokens,
            "cache_write_tokens": row.cache_write_tokens,
            "total_tokens": row.total_tokens,
        },
        "cost_usd": row.cost_usd,
        "cost_original_usd": row.cost_original_usd,
        "tokens": {"original": row.tokens_original, "forwarded": row.tokens_forwarded},
        "latency_ms": row.latency_ms,
        "finish_reason": row.finish_reason,
        "response": json.loads(response) if response else None,
        "started_at": as_utc(row.started_at).isoformat(),
        "finished_at": as_utc(row.finished_at).isoformat() if row.finished_at else None,
        "evaluation_arm": row.evaluation_arm,
        "evaluation": evaluation_as_dict(row),
    }


# A run's outcome signals (gateway/evaluation/signals.py), as columns of `model_runs`.
SIGNALS = ("answer_calls", "repeated_calls", "final_answer", "tool_results", "tool_errors", "rehydrations")


def evaluation_as_dict(row: ModelRun) -> dict[str, Any] | None:
    """A run's evaluation: its arm, policy version, outcome signals and shadow comparison (None before any)."""
    if row.evaluation_arm is None:
        return None
    shadow = None
    if row.shadow_status is not None:
        shadow = {"status": row.shadow_status, "same_action": row.shadow_same_action,
                  "similarity": row.shadow_similarity, "cost_usd": row.shadow_cost_usd}
    return {
        "arm": row.evaluation_arm,
        "policy_version": row.policy_version,
        "signals": {name: getattr(row, name) for name in SIGNALS},
        "shadow": shadow,
    }
