"""The whole config (`Settings`): its sections, the checks that span them (deployment ids, fallbacks,
tenants' keys and models), and the lookups the gateway makes of it (a requested name's deployments,
wildcard names included; a tenant's retention; paths relative to the config file)."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from gateway.settings.models import ModelSettings, RouterSettings
from gateway.settings.server import DashboardSettings, RedisSettings, ServerSettings, TelemetrySettings
from gateway.settings.storage import StorageSettings
from gateway.settings.strict import Strict
from gateway.settings.tenants import RetentionSettings, TenantSettings
from storage.retention import RetentionClasses

# What a wildcard's `*` may stand for in a requested model name (Settings._wildcard).
_WILDCARD_TEXT = re.compile(r"[A-Za-z0-9._:-]*")


class Settings(Strict):
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
