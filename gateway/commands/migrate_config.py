"""A LiteLLM Proxy `config.yaml` in this gateway's shape (`gateway migrate-config`).

Pure functions over the parsed YAML: no file, no LiteLLM import. What has no place here is
not dropped in silence: every key left behind gets a note naming it and saying why, so the
operator reads one list instead of diffing two formats.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

import yaml

from gateway.config import ENV_PREFIX, ConfigError, RouterSettings
from gateway.upstream.deployment_params import refusal

# The gateway's `router:` fields; LiteLLM's router_settings use the same names.
ROUTER_FIELDS = ("routing_strategy", "num_retries", "retry_after", "timeout", "allowed_fails", "cooldown_time",
                 "fallbacks", "context_window_fallbacks")
# litellm_settings are the process-wide defaults LiteLLM's Router falls back on when its own
# argument (router_settings) is unset, so router_settings win where both are given.
_LITELLM_SETTINGS_TO_ROUTER = {"num_retries": "num_retries", "request_timeout": "timeout",
                               "fallbacks": "fallbacks", "context_window_fallbacks": "context_window_fallbacks"}
_FALLBACK_FIELDS = ("fallbacks", "context_window_fallbacks")
# Prices LiteLLM takes from model_info and this gateway from litellm_params (gateway.upstream.litellm_client.base.PRICING_KEYS,
# not imported: that module loads LiteLLM).
_PRICE_KEYS = ("input_cost_per_token", "output_cost_per_token", "cache_read_input_token_cost",
               "cache_creation_input_token_cost")

TENANT_KEY_ENV = "GATEWAY_API_KEY"
_NO_EQUIVALENT = "no equivalent in this gateway"
_RECORDS_ITSELF = "this gateway records every run itself: its gateway.access JSON log and /metrics"
_WHY_NOT = {
    "general_settings.store_model_in_db": "models are read from this file only; add any kept in LiteLLM's database",
    "litellm_settings.callbacks": _RECORDS_ITSELF,
    "litellm_settings.success_callback": _RECORDS_ITSELF,
    "litellm_settings.failure_callback": _RECORDS_ITSELF,
    "litellm_settings.set_verbose": "use log_level: debug",
    "litellm_settings.json_logs": "this gateway logs JSON by default (log_format)",
    "router_settings.model_group_alias": "add a model entry under the alias name instead",
    **{f"router_settings.{key}": "set redis.url by hand: here Redis shares rate limits between replicas"
       for key in ("redis_host", "redis_port", "redis_password", "redis_url")},
    "include": "LiteLLM's included files are not read: paste their model_list into this file and run again",
}


@dataclass(frozen=True)
class Migration:
    config: dict[str, Any]  # this gateway's config, in the order a reader expects
    notes: tuple[str, ...]  # what was not carried over and why, and what the operator must do


def migrate(raw: Any, source: str) -> Migration:
    """This gateway's config for a parsed LiteLLM Proxy config; ConfigError when there is nothing to convert."""
    if not isinstance(raw, dict):
        raise ConfigError(source, "", "a LiteLLM Proxy config is a YAML mapping with a model_list")
    if not isinstance(raw.get("model_list"), list) or not raw["model_list"]:
        raise ConfigError(source, "model_list", "no model_list entries to convert "
                          "(models kept in LiteLLM's database are not in the file)")
    notes: list[str] = []
    models = _models(raw["model_list"], notes)
    if not models:
        raise ConfigError(source, "model_list", "no entry has a model_name and litellm_params.model")
    config: dict[str, Any] = {"models": models}
    router = _router(_section(raw, "router_settings", source), _section(raw, "litellm_settings", source), notes)
    if router:
        _check_fallback_names(router, {m["name"] for m in models}, notes)
        config["router"] = router
    config["tenants"] = [{"id": "default", "api_keys": [ENV_PREFIX + TENANT_KEY_ENV], "policy": "default"}]
    notes.append(f"tenants: LiteLLM keeps its virtual keys in its database, so none are in the file: one tenant "
                 f"'default' reads its key from {TENANT_KEY_ENV} (set it to a key other than the master key "
                 f"before serving), or add tenants here, or create keys through the gateway's key API")
    config.update(_general(_section(raw, "general_settings", source), notes))
    env = raw.get("environment_variables")
    if env:
        names = ", ".join(str(k) for k in env) if isinstance(env, dict) else "?"
        notes.append(f"environment_variables ({names}): not carried; this gateway sets no environment from its "
                     f"config: export them before `gateway serve` (os.environ/NAME references read them)")
    known = {"model_list", "router_settings", "litellm_settings", "general_settings", "environment_variables"}
    for key in raw:
        if key not in known:
            notes.append(f"{key}: not carried ({_WHY_NOT.get(str(key), _NO_EQUIVALENT)})")
    return Migration(config, tuple(notes))


def render(migration: Migration, source: str) -> str:
    """The config as YAML, the notes repeated at its head so they stay with the file."""
    head = [f"# Converted from the LiteLLM Proxy config {source} by `gateway migrate-config`."]
    if migration.notes:
        head.append("# Notes (what was not carried over, and what to do):")
        head.extend(f"#   - {note}" for note in migration.notes)
    body = yaml.safe_dump(migration.config, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)
    return "\n".join(head) + "\n" + body


def _section(raw: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(source, name, "must be a mapping")
    return value


def _models(entries: list[Any], notes: list[str]) -> list[dict[str, Any]]:
    """Entries in order; several with one model_name stay apart, as deployments of that model."""
    models = []
    for index, entry in enumerate(entries):
        where = f"model_list[{index}]"
        params = entry.get("litellm_params") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("model_name"), str) or not entry["model_name"]:
            notes.append(f"{where}: skipped: no model_name")
            continue
        if not isinstance(params, dict) or not isinstance(params.get("model"), str):
            notes.append(f"{where} ({entry['model_name']}): skipped: no litellm_params.model")
            continue
        # os.environ/NAME values stay references: this gateway's loader reads them the same way.
        carried = {}
        for key, value in params.items():
            problem = refusal(str(key))
            if problem:  # a key this gateway would refuse to load: left out, with the reason
                notes.append(f"{where} ({entry['model_name']}).litellm_params.{key}: not carried "
                             f"({problem.split(': ', 1)[-1]})")
            else:
                carried[key] = value
        info = entry.get("model_info") if isinstance(entry.get("model_info"), dict) else {}
        for key in _PRICE_KEYS:
            if key in info and key not in carried:
                carried[key] = info[key]
        model: dict[str, Any] = {"name": entry["model_name"], "litellm_params": carried}
        if isinstance(info.get("id"), (str, int)) and not isinstance(info.get("id"), bool) and str(info["id"]):
            model["id"] = str(info["id"])  # LiteLLM's deployment id: this gateway's `id` (run records, cooldowns)
        models.append(model)
        dropped = [str(k) for k in info if k not in _PRICE_KEYS and not (k == "id" and "id" in model)]
        if dropped or (entry.get("model_info") and not info):
            notes.append(f"{where} ({entry['model_name']}).model_info ({', '.join(dropped) or '?'}): dropped "
                         f"(this gateway's models carry no model_info; its prices go to litellm_params)")
        for key in entry:
            if key not in ("model_name", "litellm_params", "model_info"):
                notes.append(f"{where} ({entry['model_name']}).{key}: not carried ({_NO_EQUIVALENT})")
    return models


def _router(router_settings: dict[str, Any], litellm_settings: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    from_litellm = {_LITELLM_SETTINGS_TO_ROUTER[k]: (k, v) for k, v in litellm_settings.items()
                    if k in _LITELLM_SETTINGS_TO_ROUTER}
    router: dict[str, Any] = {}
    for field in ROUTER_FIELDS:
        if field in router_settings:
            router[field] = router_settings[field]
            if field in from_litellm and from_litellm[field][1] != router_settings[field]:
                notes.append(f"litellm_settings.{from_litellm[field][0]}: not carried; router_settings.{field} "
                             f"is used instead (LiteLLM's Router prefers its own setting too)")
        elif field in from_litellm:
            router[field] = from_litellm[field][1]
    strategy = router.get("routing_strategy")
    served = get_args(RouterSettings.model_fields["routing_strategy"].annotation)
    if strategy is not None and strategy not in served:
        del router["routing_strategy"]
        notes.append(f"router_settings.routing_strategy ({strategy}): not carried (served: {', '.join(served)})")
    for key in router_settings:
        if key not in ROUTER_FIELDS:
            reason = _WHY_NOT.get(f"router_settings.{key}", _NO_EQUIVALENT)
            notes.append(f"router_settings.{key}: not carried ({reason})")
    for key in litellm_settings:
        if key not in _LITELLM_SETTINGS_TO_ROUTER:
            notes.append(f"litellm_settings.{key}: not carried ({_WHY_NOT.get(f'litellm_settings.{key}', _NO_EQUIVALENT)})")
    return router


def _check_fallback_names(router: dict[str, Any], names: set[str], notes: list[str]) -> None:
    for field in _FALLBACK_FIELDS:
        rules = router.get(field)
        if not isinstance(rules, list):
            continue
        named = [str(n) for rule in rules if isinstance(rule, dict)
                 for model, targets in rule.items()
                 for n in [model, *(targets if isinstance(targets, list) else [targets])]]
        for name in sorted(set(named) - names):
            notes.append(f"router.{field} names {name!r}, which no model entry has: left out (the gateway "
                         "refuses a fallback to a model it does not serve)")
        kept = []
        for rule in rules:
            if not isinstance(rule, dict):
                continue
            rule = {str(model): [str(t) for t in (targets if isinstance(targets, list) else [targets])
                                 if str(t) in names]
                    for model, targets in rule.items() if str(model) in names}
            rule = {model: targets for model, targets in rule.items() if targets}
            if rule:
                kept.append(rule)
        if kept:
            router[field] = kept
        else:
            del router[field]


def _general(general: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    master = general.get("master_key")
    if master:
        out["admin_keys"] = [master]
        notes.append("admin_keys: LiteLLM's master_key becomes an admin key: it reads every tenant's records "
                     "and the admin API but makes no model requests here (use a tenant key for those)")
    url = general.get("database_url")
    if isinstance(url, str) and url:
        out["storage"] = {"url": _storage_url(url, notes)}
    else:
        notes.append("storage: LiteLLM's config names no database_url (it may read DATABASE_URL from the "
                     "environment): this config stores to SQLite beside it; set storage.url for PostgreSQL")
    for key in general:
        if key not in ("master_key", "database_url"):
            notes.append(f"general_settings.{key}: not carried "
                         f"({_WHY_NOT.get(f'general_settings.{key}', _NO_EQUIVALENT)})")
    return out


def _storage_url(url: str, notes: list[str]) -> str:
    """PostgreSQL through psycopg 3, the driver this gateway ships; its tables sit beside LiteLLM's."""
    shared = "the gateway keeps its own tables there; LiteLLM's keys and spend are not read"
    if url.startswith(ENV_PREFIX):
        notes.append(f"storage.url: reads {url[len(ENV_PREFIX):]}, which must now start with "
                     f"postgresql+psycopg:// rather than postgresql://; {shared}")
        return url
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            url = "postgresql+psycopg://" + url[len(scheme):]
    notes.append(f"storage.url: LiteLLM's database_url, as postgresql+psycopg://; {shared}")
    return url
