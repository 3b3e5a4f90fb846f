"""The `tenants:` section and what a tenant may set of its own: API keys, policy, models, rate limits,
budgets, and retention lifetimes (the top-level `retention:` gives the defaults)."""
from __future__ import annotations

from pydantic import Field, field_validator

from gateway.settings.strict import SHA256_KEY, Strict
from storage.retention import RetentionClasses, parse_duration


class LimitSettings(Strict):
    requests_per_minute: int | None = Field(None, gt=0)
    tokens_per_minute: int | None = Field(None, gt=0)  # prompt tokens as forwarded


class BudgetSettings(Strict):
    """USD a tenant (or a key) may spend per UTC day and per UTC month, as the runs' costs record it."""

    usd_per_day: float | None = Field(None, gt=0)
    usd_per_month: float | None = Field(None, gt=0)


class RetentionClassSettings(Strict):
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


class TenantSettings(Strict):
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
            if key.startswith("sha256:") and not SHA256_KEY.match(key):
                raise ValueError("a hashed key is 'sha256:' followed by 64 lowercase hex digits")
        return keys
