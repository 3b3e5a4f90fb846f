"""The tables of the record store (SQLAlchemy 2.x, SQLite or PostgreSQL)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ID = String(64)
TENANT = String(128)


class Base(DeclarativeBase):
    pass


class MessageNode(Base):
    """One transcript message in a tenant's tree; tool content lives in its artifact."""

    __tablename__ = "message_nodes"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    parent_id: Mapped[str | None] = mapped_column(ID, index=True)
    session_id: Mapped[str] = mapped_column(ID, index=True)
    depth: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(32))
    message_json: Mapped[str] = mapped_column(Text)
    artifact_id: Mapped[str | None] = mapped_column(ID)
    first_request_id: Mapped[str] = mapped_column(ID)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ModelRun(Base):
    """One upstream call made for one client request."""

    __tablename__ = "model_runs"

    id: Mapped[str] = mapped_column(ID, primary_key=True)  # the request id
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    session_id: Mapped[str] = mapped_column(ID, index=True)
    session_label: Mapped[str | None] = mapped_column(String(256))
    # The conversation: the unit users see, count and delete. `conv_<hash of tenant and label>`
    # for a session label, else the node of the first message after the system prompt.
    # Agents that share a system prompt share a tree (`session_id`), not a conversation.
    conversation_id: Mapped[str | None] = mapped_column(ID, index=True)
    participant: Mapped[str] = mapped_column(String(256))
    parent_request_id: Mapped[str | None] = mapped_column(ID, index=True)
    model: Mapped[str] = mapped_column(String(256))
    upstream_model: Mapped[str] = mapped_column(String(256))
    leaf_node_id: Mapped[str] = mapped_column(ID, index=True)
    message_count: Mapped[int] = mapped_column(Integer)
    stream: Mapped[bool] = mapped_column(Boolean)
    wire_format: Mapped[str | None] = mapped_column(String(32))  # openai.chat, ...
    instance_id: Mapped[str | None] = mapped_column(ID)  # the gateway process that served it
    status: Mapped[str] = mapped_column(String(32), index=True)
    http_status: Mapped[int | None] = mapped_column(Integer)
    error_type: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    total_tokens: Mapped[int | None] = mapped_column(Integer)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    cost_original_usd: Mapped[float | None] = mapped_column(Float)  # the client's transcript, priced alike
    tokens_original: Mapped[int | None] = mapped_column(Integer)  # as the client sent them (tiktoken)
    tokens_forwarded: Mapped[int | None] = mapped_column(Integer)  # as the projection forwarded them
    cache_write_tokens: Mapped[int | None] = mapped_column(Integer)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    finish_reason: Mapped[str | None] = mapped_column(String(64))
    response_json: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ToolCall(Base):
    """A call an assistant message requested; `run_id` is the run whose answer it was."""

    __tablename__ = "tool_calls"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    node_id: Mapped[str] = mapped_column(ID, ForeignKey("message_nodes.id"), index=True)
    call_id: Mapped[str] = mapped_column(String(256))
    name: Mapped[str] = mapped_column(String(256))
    arguments: Mapped[str] = mapped_column(Text)
    run_id: Mapped[str | None] = mapped_column(ID)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ToolArtifact(Base):
    """The raw record of one tool result, captured before anything is cut."""

    __tablename__ = "tool_artifacts"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    node_id: Mapped[str] = mapped_column(ID, ForeignKey("message_nodes.id"), unique=True)
    session_id: Mapped[str] = mapped_column(ID, index=True)
    tool_call_id: Mapped[str] = mapped_column(String(256))
    tool_call_pk: Mapped[str | None] = mapped_column(ID)
    tool_name: Mapped[str | None] = mapped_column(String(256))
    arguments: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    size_bytes: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(Integer)
    content_type: Mapped[str] = mapped_column(String(64))
    content: Mapped[bytes | None] = mapped_column(LargeBinary)
    blob_key: Mapped[str | None] = mapped_column(String(128), index=True)
    owner_participant: Mapped[str] = mapped_column(String(256))
    privacy_class: Mapped[str | None] = mapped_column(String(64))
    freshness_class: Mapped[str | None] = mapped_column(String(64))
    captured_by_request: Mapped[str] = mapped_column(ID, index=True)
    observed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # Set when the content was redacted before it was stored: `sha256` is then the stored bytes'
    # (integrity checks read those), this the captured original's, and `redacted_json` what was
    # replaced ({kind: count}).
    original_sha256: Mapped[str | None] = mapped_column(String(64))
    redacted_json: Mapped[str | None] = mapped_column(Text)


Index("ix_model_runs_tenant_started", ModelRun.tenant, ModelRun.started_at)


class ConversationNode(Base):
    """A message node one conversation uses. Conversations that begin alike share nodes (and
    their artifacts); a node goes when the last conversation that uses it is deleted. A
    conversation's nodes are closed under parents: every request adds its whole path."""

    __tablename__ = "conversation_nodes"

    conversation_id: Mapped[str] = mapped_column(ID, primary_key=True)
    node_id: Mapped[str] = mapped_column(ID, ForeignKey("message_nodes.id"), primary_key=True, index=True)


class Blob(Base):
    """A file of the blob store. Its row is the lock that capture and collection share: capture
    upserts it before writing the file, collection deletes it before removing the file."""

    __tablename__ = "blobs"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the bytes
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class GatewayInstance(Base):
    """A running gateway process; its heartbeat tells others whether its pending runs are alive."""

    __tablename__ = "gateway_instances"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    host: Mapped[str] = mapped_column(String(256))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class ContextAssembly(Base):
    """The record of one projection: what the model saw, and why."""

    __tablename__ = "context_assemblies"

    request_id: Mapped[str] = mapped_column(ID, ForeignKey("model_runs.id"), primary_key=True)
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    policy_name: Mapped[str] = mapped_column(String(128))
    policy_version: Mapped[str] = mapped_column(String(64))
    assembler_version: Mapped[str] = mapped_column(String(32))
    tokens_original: Mapped[int] = mapped_column(Integer)
    tokens_forwarded: Mapped[int] = mapped_column(Integer)
    messages_original: Mapped[int] = mapped_column(Integer)
    messages_forwarded: Mapped[int] = mapped_column(Integer)
    boundary_round: Mapped[int] = mapped_column(Integer)
    epoch_round: Mapped[int] = mapped_column(Integer)
    decisions_json: Mapped[str] = mapped_column(Text)
    omissions_json: Mapped[str] = mapped_column(Text)
    timings_json: Mapped[str] = mapped_column(Text)
    parent_request_id: Mapped[str | None] = mapped_column(ID, index=True)
    forwarded_zlib: Mapped[bytes | None] = mapped_column(LargeBinary)  # the projection as sent, compressed
    # The earlier request on the same path whose decisions this one's extend (None: stored whole).
    base_request_id: Mapped[str | None] = mapped_column(ID)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ForwardedMessage(Base):
    """A message the gateway forwarded in place of the client's (a memory, a notice, compacted
    arguments), stored once per conversation however many requests forwarded it: an assembly
    names it by digest, so what a request stores does not grow with its transcript."""

    __tablename__ = "forwarded_messages"

    conversation_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    message_zlib: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
