"""The gateway's YAML config: loading, `os.environ/NAME` references, validation.

Every error names the file, the field (as a dotted path such as
`tenants[0].api_keys[1]`) and what is wrong, so `gateway check-config` and a
failed start both say exactly where to look.
"""
from __future__ import annotations

import difflib
import hashlib
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from policies.policy import Policy, PolicyError, policy_from_mapping
from policies.presets import PRESET_NAMES, preset
from policies.validation import field_path
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

    @field_validator("metrics_token")
    @classmethod
    def _token_well_formed(cls, token: str | None) -> str | None:
        if token is not None and (not token or token != token.strip()):
            raise ValueError("the metrics token may not be empty or carry surrounding spaces")
        if token is not None and token.startswith("sha256:") and not _SHA256_KEY.match(token):
            raise ValueError("a hashed token is 'sha256:' followed by 64 lowercase hex digits")
        return token


class ModelSettings(_Strict):
    name: str = Field(min_length=1)
    litellm_params: dict[str, Any]
    provider: str | None = None  # for privacy rules; default: the prefix of litellm_params.model

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
        return value


class LimitSettings(_Strict):
    requests_per_minute: int | None = Field(None, gt=0)
    tokens_per_minute: int | None = Field(None, gt=0)  # prompt tokens as forwarded


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
    retention: RetentionClassSettings | None = None  # fields set here override the top-level `retention:`

    @field_validator("api_keys")
    @classmethod
    def _keys_well_formed(cls, keys: list[str]) -> list[str]:
        for key in keys:
            if not key or key != key.strip():
                raise ValueError("an api key may not be empty or carry surrounding spaces")
            if key.startswith("sha256:") and not _SHA256_KEY.match(key):
                raise ValueError("a hashed key is 'sha256:' followed by 64 lowercase hex digits")
        return keys


class StorageSettings(_Strict):
    url: str = "sqlite:///./gateway.db"
    blob_dir: str = "./blobs"
    inline_max_bytes: int = Field(64 * 1024, ge=0)
    # PostgreSQL connections per process (and as many again in overflow): every request holds one
    # while it captures and once more while its outcome is written, from the worker-thread pool.
    pool_size: int = Field(20, ge=1, le=500)

    @field_validator("url")
    @classmethod
    def _known_backend(cls, url: str) -> str:
        if not (url.startswith("sqlite:///") or url.startswith("postgresql")):
            raise ValueError("use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB")
        return url


class DashboardSettings(_Strict):
    session_secret: str | None = None  # set it when several replicas serve the dashboard


class RedisSettings(_Strict):
    url: str | None = None  # rate limits shared by replicas; without it, per process
    key_prefix: str = "gw:"


class Settings(_Strict):
    models: list[ModelSettings] = Field(min_length=1)
    tenants: list[TenantSettings] = Field(min_length=1)
    admin_keys: list[str] = Field(default_factory=list)
    storage: StorageSettings = StorageSettings()
    redis: RedisSettings = RedisSettings()
    server: ServerSettings = ServerSettings()
    dashboard: DashboardSettings = DashboardSettings()
    retention: RetentionSettings = RetentionSettings()
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = "json"  # one JSON object per line on stderr, or plain text
    access_log: bool = True  # one line per request (gateway.access): ids, tenant, model, tokens, latency
    source: str = Field("<memory>", exclude=True)
    base_dir: str = Field(".", exclude=True)

    @model_validator(mode="after")
    def _consistent(self) -> "Settings":
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"models: duplicate model name(s) {dupes}")
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

    def model(self, name: str) -> ModelSettings | None:
        """The model entry for a requested name: an exact name, else the first wildcard entry it matches.

        As LiteLLM Proxy routes them: `name: "claude-*"` with `litellm_params.model:
        "anthropic/claude-*"` sends `claude-sonnet-4-5` to `anthropic/claude-sonnet-4-5`; each `*`
        of the LiteLLM model takes the text the name's `*`s matched, in order.
        """
        exact = next((m for m in self.models if m.name == name), None)
        if exact is not None:
            return exact
        for entry in self.models:
            if "*" not in entry.name:
                continue
            match = re.fullmatch("(.*)".join(re.escape(part) for part in entry.name.split("*")), name, re.DOTALL)
            if match is None:
                continue
            target = str(entry.litellm_params["model"])
            if "*" in target:
                segments = match.groups()
                if len(segments) > target.count("*"):
                    target = name
                for segment in segments:
                    target = target.replace("*", segment, 1)
            return entry.model_copy(update={"litellm_params": {**entry.litellm_params, "model": target}})
        return None

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


def _read_yaml(file: Path) -> Any:
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
        return policy_from_mapping(_read_yaml(file), str(file))
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
    return parse_settings(_read_yaml(file), str(file), str(file.resolve().parent))
