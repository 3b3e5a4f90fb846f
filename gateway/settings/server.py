"""The process's own sections: `server:` (listening, limits on clients, timeouts, reloads), `dashboard:`,
`redis:` and `telemetry:`."""
from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from gateway.settings.strict import SHA256_KEY, Strict


class ServerSettings(Strict):
    host: str = "127.0.0.1"
    port: int = Field(4000, ge=0, le=65535)
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    # Slow and heavy clients (gateway/edge/connections.py, gateway/edge/request_bodies.py), nginx's defaults for the
    # timeouts: a connection's request headers must all arrive within header_timeout_seconds (else it is
    # closed), a request's body within body_timeout_seconds of its headers (else 408); at most
    # max_connections open at once in this process (past it the longest idle one is closed, or the new
    # one answered 503); request bodies being read and handled hold at most max_buffered_request_bytes
    # of this process's memory at once (past it 503 with retry-after).
    header_timeout_seconds: float = Field(60.0, gt=0)
    body_timeout_seconds: float = Field(60.0, gt=0)
    max_connections: int = Field(4096, gt=0)
    max_buffered_request_bytes: int = Field(256 * 1024 * 1024, gt=0)
    # Items of a request's transcript (chat and Anthropic `messages`, Responses `input`): past it a 400
    # (too_many_messages) before the transcript is checked or stored. 100,000 is the Anthropic Messages
    # API's own limit, so no request a provider would take is refused.
    max_messages: int = Field(100_000, gt=0)
    upstream_timeout_seconds: float = Field(600.0, gt=0)
    # Every instance beats this often; one that misses three beats is dead and its pending
    # runs are marked interrupted by the others (and by the next one to start).
    heartbeat_seconds: float = Field(10.0, gt=0)
    # Chat completions to an OpenAI-compatible deployment over a pooled HTTP client, LiteLLM still
    # deciding what is sent (gateway/upstream/direct_chat.py); false: every call through litellm.acompletion.
    direct_transport: bool = True
    # `/docs` and `/openapi.json` (off: they list every route to whoever asks).
    docs: bool = False
    # Reload when the config file or a tenant's policy file changes (checked every 2 s); SIGHUP and
    # `POST /api/admin/reload` reload whether or not this is on.
    watch_config: bool = False
    # Required as `Authorization: Bearer <token>` on `/metrics` when set (its labels name tenants);
    # plain or `sha256:<hex>` as API keys are. Admin keys are accepted too.
    metrics_token: str | None = None
    # After SIGTERM, requests in flight (a stream may run for upstream_timeout_seconds) have this
    # long to finish; then they are cancelled and the shutdown settles this instance's runs. Give
    # the platform's own grace (kubernetes terminationGracePeriodSeconds) more than this, or it
    # kills the process before that shutdown code runs.
    shutdown_grace_seconds: float = Field(630.0, gt=0)

    @field_validator("max_buffered_request_bytes")
    @classmethod
    def _holds_one_body(cls, value: int, info: ValidationInfo) -> int:
        largest = info.data.get("max_body_bytes")
        if largest is not None and value < largest:
            raise ValueError(f"is less than max_body_bytes ({largest}): a body of the largest size allowed could "
                             "never be read")
        return value

    @field_validator("metrics_token")
    @classmethod
    def _token_well_formed(cls, token: str | None) -> str | None:
        if token is not None and (not token or token != token.strip()):
            raise ValueError("the metrics token may not be empty or carry surrounding spaces")
        if token is not None and token.startswith("sha256:") and not SHA256_KEY.match(token):
            raise ValueError("a hashed token is 'sha256:' followed by 64 lowercase hex digits")
        return token


class DashboardSettings(Strict):
    session_secret: str | None = None  # set it when several replicas serve the dashboard


class RedisSettings(Strict):
    url: str | None = None  # rate limits and spend shared by replicas; without it, per process
    key_prefix: str = "gw:"
    # While Redis does not answer: count limits and spend per process (`local`), or answer model
    # requests 503 with Retry-After and refuse to start (`refuse`).
    when_down: Literal["local", "refuse"] = "local"
    timeout_seconds: float = Field(0.5, gt=0, le=30)  # the longest a request waits for Redis


class TelemetrySettings(Strict):
    """OpenTelemetry traces (gateway/ops/tracing.py), exported over OTLP/HTTP; off without an endpoint."""

    # The collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT takes it (http://collector:4318; spans go
    # to its /v1/traces), or a full URL ending in /v1/traces. The config is the only switch: write
    # `os.environ/OTEL_EXPORTER_OTLP_ENDPOINT` to take the standard variable.
    otlp_endpoint: str | None = None
    service_name: str = Field("context-gateway", min_length=1)
    headers: dict[str, str] = Field(default_factory=dict)  # sent with every export (a collector's API key)
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)  # of traces the gateway starts; a caller's decision stands
    # Record the prompt and the answer on the upstream spans (gen_ai.input.messages, gen_ai.output.messages).
    capture_content: bool = False

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"^https?://[^/\s]+", url):
            raise ValueError("an http:// or https:// URL such as http://collector:4318")
        return url
