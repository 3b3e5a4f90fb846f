"""The gateway's YAML config: loading, `os.environ/NAME` references, validation.

Every error names the file, the field (as a dotted path such as
`tenants[0].api_keys[1]`) and what is wrong, so `gateway check-config` and a
failed start both say exactly where to look.
"""
from __future__ import annotations

import base64
import binascii
import difflib
import hashlib
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.upstream.deployment_params import refusal
from gateway.upstream.provider_names import provider_problem
from gateway.yaml_lines import YamlLines
from policies.policy import Policy, PolicyError, policy_from_mapping
from policies.presets import PRESET_NAMES, preset
from policies.validation import field_path
from storage.encryption import KEY_BYTES, EncryptionKeys
from storage.retention import RetentionClasses, parse_duration

ENV_PREFIX = "os.environ/"
PLACEHOLDER = "REPLACE-ME"  # deploy/k8s/secrets.yaml's values: a config holding one is refused
_SHA256_KEY = re.compile(r"^sha256:[0-9a-f]{64}$")
# What a wildcard's `*` may stand for in a requested model name (Settings._wildcard).
_WILDCARD_TEXT = re.compile(r"[A-Za-z0-9._:-]*")


class ConfigError(Exception):
    """A config that cannot be served, with the file and field at fault (and the field's line, when known).

    `problems` holds every problem found in one reading (each a ConfigError of one problem), so a
    config with several mistakes is refused with all of them; `field` and `problem` are the first's.
    """

    def __init__(self, path: str | os.PathLike[str], field: str, problem: str, line: int | None = None,
                 problems: "list[ConfigError] | None" = None) -> None:
        self.path = str(path)
        self.field = field
        self.problem = problem
        self.line = line
        self.problems = problems or [self]
        super().__init__("\n".join(p.one_line() for p in self.problems))

    def one_line(self) -> str:
        where = f"{self.path}: {self.field}" if self.field else self.path
        at = f" (line {self.line})" if self.line is not None and not self.field.startswith("line ") else ""
        return f"{where}{at}: {self.problem}"

    @classmethod
    def of(cls, problems: "list[ConfigError]") -> "ConfigError":
        first = problems[0]
        return cls(first.path, first.field, first.problem, first.line, problems)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Strict):
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
        if token is not None and token.startswith("sha256:") and not _SHA256_KEY.match(token):
            raise ValueError("a hashed token is 'sha256:' followed by 64 lowercase hex digits")
        return token


class ModelSettings(_Strict):
    """One deployment: entries that share a `name` are deployments of one model (gateway/upstream/deployments.py)."""

    name: str = Field(min_length=1)
    litellm_params: dict[str, Any]
    provider: str | None = None  # for privacy rules; default: the prefix of litellm_params.model
    # The deployment's id in run records, logs and cooldowns; default `<name>#<n>`, n counting the
    # entries of that name from 1 (so a config's order gives every replica the same ids).
    id: str | None = Field(None, min_length=1, max_length=128)

    @property
    def provider_name(self) -> str:
        if self.provider:
            return self.provider
        if self.litellm_params.get("custom_llm_provider"):
            return str(self.litellm_params["custom_llm_provider"])
        model = str(self.litellm_params["model"])
        return model.split("/", 1)[0] if "/" in model else "openai"

    @field_validator("litellm_params")
    @classmethod
    def _needs_model(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(value.get("model"), str) or not value["model"]:
            raise ValueError("litellm_params.model is required (e.g. openai/gpt-4o-mini)")
        unknown_provider = provider_problem(value["model"], value.get("custom_llm_provider"))
        if unknown_provider:
            raise ValueError(unknown_provider)
        for key in value:
            problem = refusal(str(key))
            if problem:
                raise ValueError(problem)
        for key in ("rpm", "tpm", "order"):
            if key in value and (isinstance(value[key], bool) or not isinstance(value[key], int) or value[key] < 1):
                raise ValueError(f"litellm_params.{key} must be a whole number of at least 1")
        for key in ("weight", "timeout", "stream_timeout"):
            if key in value and (isinstance(value[key], bool) or not isinstance(value[key], (int, float))
                                 or not value[key] > 0):
                raise ValueError(f"litellm_params.{key} must be a number above 0")
        return value


class RouterSettings(_Strict):
    """How requests are spread over a model's deployments and retried (LiteLLM Router's settings).

    A request is retried on 429, 5xx, timeouts and refused connections before the first byte reaches
    the client, on another deployment of the model when one is healthy; once the model's tries are
    spent, on each of its `fallbacks` in turn. A deployment that fails more than `allowed_fails`
    times in a minute (a 429 counts at once when the model has other deployments) rests for
    `cooldown_time` seconds.
    """

    # LiteLLM's strategies: simple-shuffle (weight, else rpm/tpm as weights), least-busy, latency-based,
    # usage-based (tokens this minute), cost-based; always the lowest `order` first (gateway/upstream/deployments.py).
    routing_strategy: Literal["simple-shuffle", "least-busy", "latency-based-routing", "usage-based-routing",
                              "usage-based-routing-v2", "cost-based-routing"] = "simple-shuffle"
    num_retries: int = Field(2, ge=0, le=10)
    retry_after: float = Field(0.0, ge=0)  # seconds to wait at least before retrying the same deployment
    timeout: float | None = Field(None, gt=0)  # per call; default server.upstream_timeout_seconds
    allowed_fails: int = Field(3, ge=0)
    cooldown_time: float = Field(60.0, ge=0)
    fallbacks: list[dict[str, list[str]]] = Field(default_factory=list)
    context_window_fallbacks: list[dict[str, list[str]]] = Field(default_factory=list)

    def fallbacks_for(self, name: str, context_window: bool = False) -> list[str]:
        for entry in self.context_window_fallbacks if context_window else self.fallbacks:
            if name in entry:
                return list(entry[name])
        return []


class LimitSettings(_Strict):
    requests_per_minute: int | None = Field(None, gt=0)
    tokens_per_minute: int | None = Field(None, gt=0)  # prompt tokens as forwarded


class BudgetSettings(_Strict):
    """USD a tenant (or a key) may spend per UTC day and per UTC month, as the runs' costs record it."""

    usd_per_day: float | None = Field(None, gt=0)
    usd_per_month: float | None = Field(None, gt=0)


class RetentionClassSettings(_Strict):
    """Lifetimes counted from a conversation's last activity ("30d", "12h", "90m"; null: forever)."""

    artifacts: str | None = None  # raw tool results, their message nodes and tool calls, blob files
    memories: str | None = None  # the messages forwarded in place of tool results
    assemblies: str | None = None  # context assemblies: decisions and recorded projections
    runs: str | None = None  # run records (rolled up into the daily savings ledger first)

    @field_validator("artifacts", "memories", "assemblies", "runs")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        parse_duration(value)
        return value

    def classes(self, over: "RetentionClassSettings | None" = None) -> RetentionClasses:
        """These lifetimes, with the fields `over` sets taken from it (a tenant's own)."""
        chosen = {name: getattr(self, name) for name in ("artifacts", "memories", "assemblies", "runs")}
        if over is not None:
            chosen |= {name: getattr(over, name) for name in over.model_fields_set}
        return RetentionClasses(**{name: parse_duration(value) for name, value in chosen.items()})


class RetentionSettings(RetentionClassSettings):
    """The default lifetimes (a tenant's `retention:` overrides those it names) and the collector's pace."""

    # How often a serving gateway runs garbage collection (one replica at a time); null: only `gateway gc`.
    gc_interval_seconds: float | None = Field(3600.0, gt=0)
    batch_size: int = Field(100, ge=1, le=10_000)  # conversations per transaction


class TenantSettings(_Strict):
    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    api_keys: list[str] = Field(min_length=1)
    policy: str = "default"
    models: list[str] | None = None  # None: every model of the config
    limits: LimitSettings = LimitSettings()
    budget: BudgetSettings = BudgetSettings()
    retention: RetentionClassSettings | None = None  # fields set here override the top-level `retention:`

    @property
    def allowed_models(self) -> frozenset[str] | None:
        """The model names this tenant may use (and fall back to); None: every model of the config."""
        return frozenset(self.models) if self.models is not None else None

    @field_validator("api_keys")
    @classmethod
    def _keys_well_formed(cls, keys: list[str]) -> list[str]:
        for key in keys:
            if not key or key != key.strip():
                raise ValueError("an api key may not be empty or carry surrounding spaces")
            if key.startswith("sha256:") and not _SHA256_KEY.match(key):
                raise ValueError("a hashed key is 'sha256:' followed by 64 lowercase hex digits")
        return keys


_S3_ONLY = ("bucket", "prefix", "endpoint_url", "region", "access_key_id", "secret_access_key")


class BlobSettings(_Strict):
    """Where blobs (artifacts over inline_max_bytes) live: a folder, or an S3-compatible bucket."""

    backend: Literal["directory", "s3"] = "directory"
    dir: str | None = Field(None, validate_default=True)  # directory: ./blobs unless given
    bucket: str | None = Field(None, validate_default=True)  # s3: required
    prefix: str = ""  # s3: objects are named <prefix>/<sha256>
    endpoint_url: str | None = None  # s3: MinIO, Ceph, R2...; none: AWS
    region: str | None = None
    # s3: both or neither (then boto3's usual chain: environment, shared files, instance role).
    access_key_id: str | None = None
    secret_access_key: str | None = Field(None, validate_default=True)

    @field_validator("dir")
    @classmethod
    def _dir_for_directory(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("backend") == "s3":
            raise ValueError("only for backend: directory")
        return value

    @field_validator(*_S3_ONLY)
    @classmethod
    def _s3_fields_for_s3(cls, value: Any, info: ValidationInfo) -> Any:
        if info.data.get("backend") == "directory" and value not in (None, ""):
            raise ValueError("only for backend: s3")
        if info.field_name == "bucket" and info.data.get("backend") == "s3" and not value:
            raise ValueError("required for backend: s3")
        if info.field_name == "secret_access_key" and (value is None) != (info.data.get("access_key_id") is None):
            raise ValueError("give access_key_id and secret_access_key together, or neither")
        return value


def _key_bytes(value: str) -> bytes:
    return base64.b64decode(value.strip(), validate=True)


def _valid_key(value: str) -> str:
    """A key that decodes to 32 bytes; the message never repeats it (config errors are logged)."""
    try:
        key = _key_bytes(value)
    except (binascii.Error, ValueError):
        raise ValueError("not base64: an encryption key is 32 random bytes in base64 "
                         "(python -c \"import os,base64;print(base64.b64encode(os.urandom(32)).decode())\")") from None
    if len(key) != KEY_BYTES:
        raise ValueError(f"an encryption key is {KEY_BYTES} bytes in base64; this one decodes to {len(key)}")
    return value


_EncryptionKey = Annotated[str, AfterValidator(_valid_key)]


class StorageSettings(_Strict):
    url: str = "sqlite:///./gateway.db"
    blob_dir: str | None = None  # the same as blobs.dir (kept for configs written before storage.blobs)
    blobs: BlobSettings = Field(BlobSettings(), validate_default=False)
    inline_max_bytes: int = Field(64 * 1024, ge=0)
    # PostgreSQL connections per process (and as many again in overflow): every request holds one
    # while it captures and once more while its outcome is written, from the worker-thread pool.
    pool_size: int = Field(20, ge=1, le=500)
    # Encryption at rest of captured tool results (inline, blobs, forwarded memories): an AES-256
    # key, 32 bytes in base64, best given as `os.environ/NAME`. Unset: stored in the clear.
    encryption_key: _EncryptionKey | None = Field(None, repr=False)
    # Older keys, still accepted for reading until `gateway encryption rotate` has re-sealed everything.
    decryption_keys: list[_EncryptionKey] = Field(default_factory=list, repr=False)

    @field_validator("url")
    @classmethod
    def _known_backend(cls, url: str) -> str:
        if not (url.startswith("sqlite:///") or url.startswith("postgresql")):
            raise ValueError("use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB")
        return url

    @field_validator("blobs")
    @classmethod
    def _one_blob_folder(cls, blobs: BlobSettings, info: ValidationInfo) -> BlobSettings:
        if info.data.get("blob_dir") is not None:
            raise ValueError("give storage.blob_dir or storage.blobs, not both")
        return blobs

    @property
    def blob_folder(self) -> str:
        """The directory backend's folder (relative to the config file)."""
        return self.blob_dir or self.blobs.dir or "./blobs"

    def encryption_keys(self) -> EncryptionKeys:
        current = _key_bytes(self.encryption_key) if self.encryption_key else None
        return EncryptionKeys(current, [_key_bytes(k) for k in self.decryption_keys])


class DashboardSettings(_Strict):
    session_secret: str | None = None  # set it when several replicas serve the dashboard


class RedisSettings(_Strict):
    url: str | None = None  # rate limits and spend shared by replicas; without it, per process
    key_prefix: str = "gw:"
    # While Redis does not answer: count limits and spend per process (`local`), or answer model
    # requests 503 with Retry-After and refuse to start (`refuse`).
    when_down: Literal["local", "refuse"] = "local"
    timeout_seconds: float = Field(0.5, gt=0, le=30)  # the longest a request waits for Redis


class TelemetrySettings(_Strict):
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


class Settings(_Strict):
    models: list[ModelSettings] = Field(min_length=1)
    tenants: list[TenantSettings] = Field(min_length=1)
    admin_keys: list[str] = Field(default_factory=list)
    storage: StorageSettings = StorageSettings()
    redis: RedisSettings = RedisSettings()
    server: ServerSettings = ServerSettings()
    dashboard: DashboardSettings = DashboardSettings()
    router: RouterSettings = RouterSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    retention: RetentionSettings = RetentionSettings()
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = "json"  # one JSON object per line on stderr, or plain text
    access_log: bool = True  # one line per request (gateway.access): ids, tenant, model, tokens, latency
    source: str = Field("<memory>", exclude=True)
    base_dir: str = Field(".", exclude=True)

    @model_validator(mode="after")
    def _consistent(self) -> "Settings":
        names = [m.name for m in self.models]
        ids = [deployment_id for deployment_id, _ in self.deployment_ids()]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"models: duplicate deployment id(s) {dupes}")
        for field in ("fallbacks", "context_window_fallbacks"):
            for entry in getattr(self.router, field):
                for name in [*entry, *(target for targets in entry.values() for target in targets)]:
                    if self.model(name) is None:
                        raise ValueError(f"router.{field}: {name!r} is no model of this config")
        ids = [t.id for t in self.tenants]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"tenants: duplicate tenant id(s) {dupes}")
        seen: dict[str, str] = {}
        for tenant in self.tenants:
            for key in tenant.api_keys:
                digest = key_digest(key)
                if digest in seen:
                    raise ValueError(f"tenants: tenant {tenant.id!r} reuses a key of {seen[digest]!r}")
                seen[digest] = tenant.id
            for model in tenant.models or []:
                if model not in names:
                    raise ValueError(f"tenants: tenant {tenant.id!r} names unknown model {model!r}")
        for key in self.admin_keys:
            if key_digest(key) in seen:
                raise ValueError("admin_keys: an admin key is also a tenant key")
        return self

    def deployment_ids(self) -> list[tuple[str, ModelSettings]]:
        """Every entry with its deployment id (its own `id`, else `<name>#<n>`)."""
        counts: dict[str, int] = {}
        out = []
        for entry in self.models:
            counts[entry.name] = counts.get(entry.name, 0) + 1
            out.append((entry.id or f"{entry.name}#{counts[entry.name]}", entry))
        return out

    def model(self, name: str) -> ModelSettings | None:
        """The first deployment for a requested name (see `deployments`)."""
        found = self.deployments(name)
        return found[0][1] if found else None

    def deployments(self, name: str) -> list[tuple[str, ModelSettings]]:
        """The deployments (id, entry) serving a requested name: the entries of that exact name, else
        those of the first wildcard name it matches, with `litellm_params.model` filled in."""
        exact = [(i, m) for i, m in self.deployment_ids() if m.name == name]
        if exact:
            return exact
        pattern = next((m.name for m in self.models if "*" in m.name and self._wildcard(m, name) is not None), None)
        if pattern is None:
            return []
        return [(i, self._wildcard(m, name)) for i, m in self.deployment_ids() if m.name == pattern]  # type: ignore[misc]

    @staticmethod
    def _wildcard(entry: ModelSettings, name: str) -> ModelSettings | None:
        """The entry for `name` if its wildcard name matches it.

        As LiteLLM Proxy routes them: `name: "claude-*"` with `litellm_params.model:
        "anthropic/claude-*"` sends `claude-sonnet-4-5` to `anthropic/claude-sonnet-4-5`; each `*`
        of the LiteLLM model takes the text the name's `*`s matched, in order. That text is a plain
        model name (`_WILDCARD_TEXT`: letters, digits, `.`, `_`, `-`, `:`, no `..`), since LiteLLM puts
        it into the provider's URL path: a name that needs anything else matches no wildcard.
        """
        match = re.fullmatch("(.*)".join(re.escape(part) for part in entry.name.split("*")), name, re.DOTALL)
        if match is None or not all(_WILDCARD_TEXT.fullmatch(part) and ".." not in part for part in match.groups()):
            return None
        target = str(entry.litellm_params["model"])
        if "*" in target:
            segments = match.groups()
            if len(segments) > target.count("*"):
                target = name
            for segment in segments:
                target = target.replace("*", segment, 1)
        return entry.model_copy(update={"litellm_params": {**entry.litellm_params, "model": target}})

    def retention_for(self, tenant: str) -> RetentionClasses:
        """A tenant's retention classes; a tenant no longer in the config has the defaults."""
        entry = next((t for t in self.tenants if t.id == tenant), None)
        return self.retention.classes(entry.retention if entry else None)

    def resolve_path(self, value: str) -> Path:
        """A path from the config, relative to the config file's folder."""
        path = Path(value)
        return path if path.is_absolute() else Path(self.base_dir) / path

    def storage_url(self) -> str:
        """The storage URL with a relative SQLite path made relative to the config file."""
        url = self.storage.url
        prefix = "sqlite:///"
        if url.startswith(prefix) and not url.startswith(prefix + "/") and ":memory:" not in url:
            return prefix + str(self.resolve_path(url[len(prefix):]))
        return url


def key_digest(key: str) -> str:
    """The sha256 hex digest a key is compared by; `sha256:<hex>` keys are digests already."""
    if key.startswith("sha256:"):
        return key[len("sha256:") :]
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _resolve_env(value: Any, where: str, path: str, missing: list[ConfigError],
                 loc: tuple[Any, ...] = (), lines: YamlLines | None = None) -> Any:
    """`value` with every `os.environ/NAME` read; each variable that is not set is added to `missing`."""
    if isinstance(value, dict):
        return {k: _resolve_env(v, f"{where}.{k}" if where else str(k), path, missing, (*loc, k), lines)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_env(v, f"{where}[{i}]", path, missing, (*loc, i), lines) for i, v in enumerate(value)]
    if isinstance(value, str) and value.startswith(ENV_PREFIX):
        name = value[len(ENV_PREFIX) :]
        if name not in os.environ:
            missing.append(ConfigError(path, where, f"environment variable {name} is not set",
                                       lines.line(loc) if lines else None))
            return value
        if PLACEHOLDER in os.environ[name]:
            missing.append(ConfigError(path, where, f"environment variable {name} holds a placeholder "
                                       f"({PLACEHOLDER}...): set the real value", lines.line(loc) if lines else None))
        return os.environ[name]
    if isinstance(value, str) and PLACEHOLDER in value:
        missing.append(ConfigError(path, where, f"a placeholder ({PLACEHOLDER}...): set the real value",
                                   lines.line(loc) if lines else None))
    return value


def _close_field(loc: tuple[Any, ...]) -> str | None:
    """The field name close to an unknown one that its section knows (`tenantz` -> `tenants`), or None."""
    model: Any = Settings
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            if isinstance(part, int):
                continue
            return None
        annotation = field.annotation
        inner = getattr(annotation, "__args__", None)
        model = next((a for a in inner or (annotation,) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return None
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    return close[0] if close else None


def _validation_problems(exc: ValidationError, path: str, lines: YamlLines | None) -> list[ConfigError]:
    """One problem per field pydantic refused, unknown fields first. A misspelt field shows as unknown
    and, often, as the field it meant missing or invalid too: the spelling is named, the other left out."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    meant = {(*e["loc"][:-1], close) for e in errors if e["type"] == "extra_forbidden"
             for close in [_close_field(tuple(e["loc"]))] if close}
    problems = []
    for error in errors:
        loc = tuple(error["loc"])
        field = field_path(loc)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            close = _close_field(loc)
            message = "unknown field" + (f"; did you mean {close!r}?" if close else "")
        if error["type"] == "missing":
            message = "required field is missing"
        if not field and ": " in message:  # a model-level check names its own field
            field, message = message.split(": ", 1)
            loc = _loc_of(field)
        inner = re.match(rf"{re.escape(str(loc[-1]))}\.(\w+):? ", message) if loc else None
        if inner:  # "litellm_params.api_bse is not ...": the key itself is the field at fault
            field, loc, message = f"{field}.{inner.group(1)}", (*loc, inner.group(1)), message[inner.end():]
        if loc not in meant:
            problems.append(ConfigError(path, field, message, lines.line(loc) if lines else None))
    return problems


def _loc_of(field: str) -> tuple[Any, ...]:
    """`tenants[0].api_keys` as a path: ("tenants", 0, "api_keys")."""
    return tuple(int(part) if part.isdigit() else part for part in re.findall(r"[^.\[\]]+", field))


def parse_settings(raw: Any, path: str = "<memory>", base_dir: str = ".", lines: YamlLines | None = None) -> Settings:
    """Settings from a parsed config; ConfigError naming every problem found (with its line, given `lines`)."""
    if not isinstance(raw, dict):
        raise ConfigError(path, "", "the config must be a YAML mapping")
    if "model_list" in raw and "models" not in raw:  # before its os.environ/ references fail one by one
        raise ConfigError(path, "", "this looks like a LiteLLM Proxy config (model_list); "
                          f"convert it with `gateway migrate-config {path}`")
    problems: list[ConfigError] = []
    resolved = _resolve_env(raw, "", path, problems, (), lines)
    problems += _policy_problems(resolved, path, base_dir, lines)  # every policy loads, or the config is refused
    try:
        settings = Settings.model_validate({**resolved, "source": path, "base_dir": base_dir})
    except ValidationError as exc:
        said = {problem.field for problem in problems}  # a value left as os.environ/NAME, a policy: said once
        invalid = [p for p in _validation_problems(exc, path, lines) if p.field not in said]
        raise ConfigError.of(problems + invalid) from exc
    if problems:
        raise ConfigError.of(problems)
    return settings


def _policy_problems(raw: dict[str, Any], path: str, base_dir: str, lines: YamlLines | None) -> list[ConfigError]:
    """The tenants' policies that do not load (presets by name, files relative to the config's folder)."""
    tenants = raw.get("tenants")
    problems = []
    for index, tenant in enumerate(tenants if isinstance(tenants, list) else []):
        reference = tenant.get("policy", "default") if isinstance(tenant, dict) else None
        if not isinstance(reference, str):
            continue  # the schema says what is wrong with it
        field = f"tenants[{index}].policy"
        try:
            _policy(reference, Path(base_dir), path, field)
        except ConfigError as error:
            line = lines.line(("tenants", index, "policy")) if lines and error.path == path else error.line
            problems.append(ConfigError(error.path, error.field, error.problem, line))
    return problems


def read_yaml(file: Path) -> Any:
    return _read_yaml(file)[0]


def _read_yaml(file: Path) -> tuple[Any, YamlLines]:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(file, "", f"cannot read the file ({exc.strerror})") from exc
    try:
        return yaml.safe_load(text), YamlLines.of(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        raise ConfigError(file, where, f"not valid YAML ({getattr(exc, 'problem', exc)})") from exc


def policy_file(file: Path) -> Policy:
    """A YAML policy file; errors name the file and the field."""
    try:
        return policy_from_mapping(read_yaml(file), str(file))
    except PolicyError as exc:
        raise ConfigError(exc.source, exc.field, exc.problem) from exc


def load_policy(reference: str, settings: Settings, field: str) -> Policy:
    """A preset by name, or a YAML policy file (relative to the config file)."""
    return _policy(reference, Path(settings.base_dir), settings.source, field)


def _policy(reference: str, base_dir: Path, source: str, field: str) -> Policy:
    if reference in PRESET_NAMES:
        return preset(reference)
    file = Path(reference) if Path(reference).is_absolute() else base_dir / reference
    if not file.is_file():
        close = difflib.get_close_matches(reference, PRESET_NAMES, n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(source, field,
                          f"{reference!r} is neither a preset ({', '.join(PRESET_NAMES)}) nor a policy file{hint}")
    return policy_file(file)


def tenant_policies(settings: Settings) -> dict[str, Policy]:
    return {
        tenant.id: load_policy(tenant.policy, settings, f"tenants[{index}].policy")
        for index, tenant in enumerate(settings.tenants)
    }


def load_settings(path: str | os.PathLike[str]) -> Settings:
    file = Path(path)
    raw, lines = _read_yaml(file)
    return parse_settings(raw, str(file), str(file.resolve().parent), lines)
