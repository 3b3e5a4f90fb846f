"""The tables of the record store (SQLAlchemy 2.x, SQLite or PostgreSQL)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
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
    """One transcript message in a tenant's tree; tool content lives in its artifact.

    The conversation's text columns (here `message_json`; a tool call's and an artifact's `arguments`;
    a run's `response_json` and `error_message`) hold an envelope in base64 when their row's `key_id`
    is set (storage/encryption.py), their text as it came when it is None."""

    __tablename__ = "message_nodes"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    parent_id: Mapped[str | None] = mapped_column(ID, index=True)
    tree_id: Mapped[str] = mapped_column("session_id", ID, index=True)  # the column's name is older than the word
    depth: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(32))
    message_json: Mapped[str] = mapped_column(Text)  # sealed when a key is set
    key_id: Mapped[str | None] = mapped_column(String(16))
    artifact_id: Mapped[str | None] = mapped_column(ID)
    first_request_id: Mapped[str] = mapped_column(ID)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ModelRun(Base):
    """One upstream call made for one client request."""

    __tablename__ = "model_runs"

    id: Mapped[str] = mapped_column(ID, primary_key=True)  # the request id
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    tree_id: Mapped[str] = mapped_column("session_id", ID, index=True)  # the column's name is older than the word
    session_label: Mapped[str | None] = mapped_column(String(256))
    # The conversation: the unit users see, count and delete. `conv_<hash of tenant and label>`
    # for a session label, else its first exchange (policies.transcript.conversation_id_for): a run
    # before any answer is its own (its request id) until its answer moves it into the conversation
    # that answer opens. Agents that share a system prompt share a tree (`tree_id`), not a conversation.
    conversation_id: Mapped[str | None] = mapped_column(ID, index=True)
    participant: Mapped[str] = mapped_column(String(256))
    parent_request_id: Mapped[str | None] = mapped_column(ID, index=True)
    # A subagent run's parent's conversation (moved with it when a first run is moved): the subagent runs of a
    # conversation are found through this index, without reading the conversation's every run.
    parent_conversation_id: Mapped[str | None] = mapped_column(ID, index=True)
    model: Mapped[str] = mapped_column(String(256))
    upstream_model: Mapped[str] = mapped_column(String(256))
    deployment: Mapped[str | None] = mapped_column(String(128))  # the deployment that answered (or failed last)
    attempts_json: Mapped[str | None] = mapped_column(Text)  # every upstream try, when there was more than one
    leaf_node_id: Mapped[str] = mapped_column(ID)  # indexed with started_at (ix_model_runs_leaf_started)
    message_count: Mapped[int] = mapped_column(Integer)
    stream: Mapped[bool] = mapped_column(Boolean)
    wire_format: Mapped[str | None] = mapped_column(String(32))  # openai.chat, ...
    instance_id: Mapped[str | None] = mapped_column(ID)  # the gateway process that served it
    # The key it came with: an `api_keys` id, or `key-<digest prefix>` for a key of the config.
    api_key_id: Mapped[str | None] = mapped_column(ID, index=True)
    status: Mapped[str] = mapped_column(String(32), index=True)
    http_status: Mapped[int | None] = mapped_column(Integer)
    error_type: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)  # sealed when a key is set, as is response_json
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
    key_id: Mapped[str | None] = mapped_column(String(16))  # what error_message and response_json are sealed under
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Evaluation (gateway/evaluation/): the arm of its conversation ("projected" | "holdout") and the
    # tenant's policy version it was evaluated under (the same in both arms).
    evaluation_arm: Mapped[str | None] = mapped_column(String(16))
    policy_version: Mapped[str | None] = mapped_column(String(64))
    # Outcome signals read from the request and its answer: the answer's calls, those repeating an earlier
    # call of the conversation (same tool, same arguments), whether it is a final answer, the tool results
    # the request brought (and how many report an error), the artifacts put back raw in hidden rounds.
    answer_calls: Mapped[int | None] = mapped_column(Integer)
    repeated_calls: Mapped[int | None] = mapped_column(Integer)
    final_answer: Mapped[bool | None] = mapped_column(Boolean)
    tool_results: Mapped[int | None] = mapped_column(Integer)
    tool_errors: Mapped[int | None] = mapped_column(Integer)
    rehydrations: Mapped[int | None] = mapped_column(Integer)
    # A shadow comparison (the request sent again unprojected after the client had its answer): how it
    # ended (ok | error | over_budget | busy), whether the next actions agreed, their similarity, its cost.
    shadow_status: Mapped[str | None] = mapped_column(String(16))
    shadow_same_action: Mapped[bool | None] = mapped_column(Boolean)
    shadow_similarity: Mapped[float | None] = mapped_column(Float)
    shadow_cost_usd: Mapped[float | None] = mapped_column(Float)


class ToolCall(Base):
    """A call an assistant message requested; `run_id` is the run whose answer it was."""

    __tablename__ = "tool_calls"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    node_id: Mapped[str] = mapped_column(ID, ForeignKey("message_nodes.id"), index=True)
    call_id: Mapped[str] = mapped_column(String(256))
    name: Mapped[str] = mapped_column(String(256))
    arguments: Mapped[str] = mapped_column(Text)  # sealed when a key is set
    key_id: Mapped[str | None] = mapped_column(String(16))
    run_id: Mapped[str | None] = mapped_column(ID)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ToolArtifact(Base):
    """The raw record of one tool result, captured before anything is cut."""

    __tablename__ = "tool_artifacts"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    node_id: Mapped[str] = mapped_column(ID, ForeignKey("message_nodes.id"), unique=True)
    tree_id: Mapped[str] = mapped_column("session_id", ID, index=True)  # the column's name is older than the word
    tool_call_id: Mapped[str] = mapped_column(String(256))
    tool_call_pk: Mapped[str | None] = mapped_column(ID)
    tool_name: Mapped[str | None] = mapped_column(String(256))
    arguments: Mapped[str | None] = mapped_column(Text)  # sealed when a key is set
    status: Mapped[str] = mapped_column(String(16))
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    size_bytes: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(Integer)
    content_type: Mapped[str] = mapped_column(String(64))
    content: Mapped[bytes | None] = mapped_column(LargeBinary)  # inline: sealed when a key is set
    # The key `content` (inline) and `arguments` are sealed under (storage/encryption.py); None: in the
    # clear. A blob's key is its registry row's: one file serves every artifact of its content.
    key_id: Mapped[str | None] = mapped_column(String(16))
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
    # When a model first had it back whole through the rehydration tool: later requests forward it whole.
    rehydrated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


Index("ix_model_runs_tenant_started", ModelRun.tenant, ModelRun.started_at)
# Each leaf's latest run is one probe from this index's end, however many runs ended there (storage/path_reads.py).
Index("ix_model_runs_leaf_started", ModelRun.leaf_node_id, ModelRun.started_at)


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

    key: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the (plaintext) bytes
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    key_id: Mapped[str | None] = mapped_column(String(16))  # the file's sealing key; None: in the clear
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
    key_id: Mapped[str | None] = mapped_column(String(16))  # forwarded_zlib's sealing key, if sealed
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
    message_zlib: Mapped[bytes] = mapped_column(LargeBinary)  # compressed, then sealed when a key is set
    key_id: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ApiKey(Base):
    """A key made through `POST /api/keys`: only its sha256 is kept, beside the config's keys."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    name: Mapped[str | None] = mapped_column(String(256))
    digest: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the key
    prefix: Mapped[str] = mapped_column(String(16))  # its first characters, to tell keys apart
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    models: Mapped[list[str] | None] = mapped_column(JSON)  # None: the tenant's models
    budget: Mapped[dict | None] = mapped_column(JSON)  # usd_per_day, usd_per_month
    limits: Mapped[dict | None] = mapped_column(JSON)  # requests_per_minute, tokens_per_minute


class Conversation(Base):
    """A conversation's last activity, which every retention lifetime counts from (storage/retention.py).

    Capture moves `last_active_at` on each request and clears `collected`, so a conversation in use
    never loses what its projection names; `collected` holds a bit per retention class already
    collected since it went idle."""

    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_active_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    collected: Mapped[int] = mapped_column(Integer, default=0)
    # The node of its first user message, which the dashboard names an unlabelled conversation by (no
    # foreign key: retention may remove the node and keep the row; the name then falls back to the id).
    opening_node_id: Mapped[str | None] = mapped_column(ID)
    # Which life of the conversation's records this is: random when the row is made, moved on whenever
    # something a capture read may have changed (retention's claim of a class, a result a model had
    # back whole). What a process keeps of a conversation's artifact facts is valid for one value
    # (storage/path_reads.py `PathFacts`), on every replica, since each capture reads it under the row's lock.
    incarnation: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # How many of its memberships are tool results (artifacts): captures add what they insert, under the
    # row's lock. NULL: not counted yet (new, migrated, or claimed by retention); the next capture counts.
    artifact_members: Mapped[int | None] = mapped_column(Integer, nullable=True)


Index("ix_conversations_tenant_last_active", Conversation.tenant, Conversation.last_active_at)


class ConversationMemberDelta(Base):
    """PostgreSQL: tool results a capture added to a conversation whose row it only share-locked. Such a
    capture cannot add them to `Conversation.artifact_members` (two captures that both asked to upgrade
    their share lock would deadlock), so it leaves a row here, in the statement that inserts the
    memberships; the conversation holds `artifact_members` plus what its rows add. The next capture
    that takes the row exclusively folds them in, and a capture that finds many folds them into one
    (storage/artifact_members.py)."""

    __tablename__ = "conversation_member_deltas"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(ID, ForeignKey("conversations.id", ondelete="CASCADE"),
                                                 index=True)
    added: Mapped[int] = mapped_column(Integer)


class SavingsLedgerDay(Base):
    """Finished runs rolled up per tenant, day, model and session before retention removes them, so the
    savings ledger (`/api/savings`) reads these rows plus the runs still kept, and its totals stay."""

    __tablename__ = "savings_ledger"

    tenant: Mapped[str] = mapped_column(TENANT, primary_key=True)
    day: Mapped[str] = mapped_column(String(10), primary_key=True)  # YYYY-MM-DD (UTC)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)
    session: Mapped[str] = mapped_column(String(256), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    tokens_sent: Mapped[int | None] = mapped_column(BigInteger)
    tokens_forwarded: Mapped[int | None] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cached_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cache_write_tokens: Mapped[int | None] = mapped_column(BigInteger)
    completion_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    cost_original_usd: Mapped[float | None] = mapped_column(Float)
    evaluation_cost_usd: Mapped[float | None] = mapped_column(Float)  # shadow comparisons: never savings
    first_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class TenantPurge(Base):
    """The audit entry a tenant purge leaves: who, when, and how many rows of each table went."""

    __tablename__ = "tenant_purges"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    actor: Mapped[str] = mapped_column(String(256))
    purged_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    counts_json: Mapped[str] = mapped_column(Text)


class DashboardSession(Base):
    """A signed-in dashboard browser. The cookie names it (gateway/access/dashboard_sessions.py); a page is served only
    while its row is here, so signing out, revoking the key or removing it ends it on every replica."""

    __tablename__ = "dashboard_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 hex of the cookie's session id
    key_id: Mapped[str] = mapped_column(ID, index=True)  # the key that signed in: a made key's id or key-<digest>
    tenant: Mapped[str | None] = mapped_column(TENANT, index=True)  # None: an admin key
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class Compaction(Base):
    """One remote compaction a client asked for (Codex's `compaction_trigger`, `POST /v1/responses/compact`):
    forwarded to the provider's own endpoint, or answered by the gateway with a signed reference to the
    transcript it captured (gateway/pipeline/compaction.py). Counts only: the transcript is the run's."""

    __tablename__ = "compactions"

    id: Mapped[str] = mapped_column(ID, primary_key=True)  # cmp_<hex>, the compaction item's id
    tenant: Mapped[str] = mapped_column(TENANT, index=True)
    request_id: Mapped[str] = mapped_column(ID, index=True)  # the run that captured the compacted transcript
    conversation_id: Mapped[str | None] = mapped_column(ID, index=True)
    source: Mapped[str] = mapped_column(String(16))  # "provider" (forwarded) or "gateway" (answered here)
    endpoint: Mapped[str] = mapped_column(String(32))  # "responses" (a trigger item) or "responses/compact"
    model: Mapped[str] = mapped_column(String(256))
    input_items: Mapped[int] = mapped_column(Integer)  # the client's input items, compacted
    input_tokens: Mapped[int] = mapped_column(Integer)  # their tokens as the client sent them
    forwarded_tokens: Mapped[int] = mapped_column(Integer)  # tokens sent to the provider (0 when answered here)
    output_items: Mapped[int] = mapped_column(Integer)
    output_bytes: Mapped[int] = mapped_column(Integer)  # the answer's output items, as JSON
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
