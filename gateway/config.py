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
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, \
    model_validator

from gateway.deployment_params import refusal
from policies.policy import Policy, PolicyError, policy_from_mapping
from policies.presets import PRESET_NAMES, preset
from policies.validation import field_path
from storage.encryption import KEY_BYTES, EncryptionKeys
from storage.retention import RetentionClasses, parse_duration

ENV_PREFIX = "os.environ/"
_SHA256_KEY = re.compile(r"^sha256:[0-9a-f]{64}$")


class ConfigError(Exception):
    """A config that cannot be served, with the file and field at fault."""

    def __init__(self, path: str | os.PathLike[str], field: str, problem: str) -> None:
        self.path = str(path)
        self.field = field
        self.problem = problem
        where = f"{self.path}: {field}" if field else self.path
        super().__init__(f"{where}: {problem}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(4000, ge=0, le=65535)
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    # Items of a request's transcript (chat and Anthropic `messages`, Responses `input`): past it a 400
    # (too_many_messages) before the transcript is checked or stored. 100,000 is the Anthropic Messages
    # API's own limit, so no request a provider would take is refused.
    max_messages: int = Field(100_000, gt=0)
    upstream_timeout_seconds: float = Field(600.0, gt=0)
    # Every instance beats this often; one that misses three beats is dead and its pending
    # runs are marked interrupted by the others (and by the next one to start).
    heartbeat_seconds: float = Field(10.0, gt=0)
    # Chat completions to an OpenAI-compatible deployment over a pooled HTTP client, LiteLLM still
    # deciding what is sent (gateway/direct_chat.py); false: every call through litellm.acompletion.
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

    @field_validator("metrics_token")
    @classmethod
    def _token_well_formed(cls, token: str | None) -> str | None:
        if token is not None and (not token or token != token.strip()):
            raise ValueError("the metrics token may not be empty or carry surrounding spaces")
        if token is not None and token.startswith("sha256:") and not _SHA256_KEY.match(token):
            raise ValueError("a hashed token is 'sha256:' followed by 64 lowercase hex digits")
        return token


class ModelSettings(_Strict):
    """One deployment: entries that share a `name` are deployments of one model (gateway/deployments.py)."""

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
    # usage-based (tokens this minute), cost-based; always the lowest `order` first (gateway/deployments.py).
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
    # Older keys, still accepted for reading until `gateway keys rotate` has re-sealed everything.
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


class TelemetrySettings(_Strict):
    """OpenTelemetry traces (gateway/tracing.py), exported over OTLP/HTTP; off without an endpoint."""

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
        of the LiteLLM model takes the text the name's `*`s matched, in order.
        """
        match = re.fullmatch("(.*)".join(re.escape(part) for part in entry.name.split("*")), name, re.DOTALL)
        if match is None:
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


def _resolve_env(value: Any, where: str, path: str) -> Any:
    if isinstance(value, dict):
        return {k: _resolve_env(v, f"{where}.{k}" if where else str(k), path) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_env(v, f"{where}[{i}]", path) for i, v in enumerate(value)]
    if isinstance(value, str) and value.startswith(ENV_PREFIX):
        name = value[len(ENV_PREFIX) :]
        if name not in os.environ:
            raise ConfigError(path, where, f"environment variable {name} is not set")
        return os.environ[name]
    return value


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """`; did you mean 'tenants'?` for a field name close to one its section knows."""
    model: Any = Settings
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            if isinstance(part, int):
                continue
            return ""
        annotation = field.annotation
        inner = getattr(annotation, "__args__", None)
        model = next((a for a in inner or (annotation,) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def parse_settings(raw: Any, path: str = "<memory>", base_dir: str = ".") -> Settings:
    if not isinstance(raw, dict):
        raise ConfigError(path, "", "the config must be a YAML mapping")
    if "model_list" in raw and "models" not in raw:  # before its os.environ/ references fail one by one
        raise ConfigError(path, "", "this looks like a LiteLLM Proxy config (model_list); "
                          f"convert it with `gateway migrate-config {path}`")
    resolved = _resolve_env(raw, "", path)
    try:
        settings = Settings.model_validate({**resolved, "source": path, "base_dir": base_dir})
    except ValidationError as exc:
        errors = exc.errors()
        # A misspelt field shows as unknown and, often, as a required one missing: name the spelling.
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        field = field_path(tuple(first["loc"]))
        message = first["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if first["type"] == "extra_forbidden":
            message = "unknown field" + _did_you_mean(first["loc"])
        if first["type"] == "missing":
            message = "required field is missing"
        if not field and ": " in message:  # a model-level check names its own field
            field, message = message.split(": ", 1)
        raise ConfigError(path, field, message) from exc
    tenant_policies(settings)  # every policy loads, or the config is refused
    return settings


def read_yaml(file: Path) -> Any:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(file, "", f"cannot read the file ({exc.strerror})") from exc
    try:
        return yaml.safe_load(text)
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
    if reference in PRESET_NAMES:
        return preset(reference)
    file = settings.resolve_path(reference)
    if not file.is_file():
        raise ConfigError(
            settings.source, field,
            f"{reference!r} is neither a preset ({', '.join(PRESET_NAMES)}) nor a policy file",
        )
    return policy_file(file)


def tenant_policies(settings: Settings) -> dict[str, Policy]:
    return {
        tenant.id: load_policy(tenant.policy, settings, f"tenants[{index}].policy")
        for index, tenant in enumerate(settings.tenants)
    }


def load_settings(path: str | os.PathLike[str]) -> Settings:
    file = Path(path)
    return parse_settings(read_yaml(file), str(file), str(file.resolve().parent))
