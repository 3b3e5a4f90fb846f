"""Reloading the config and policy files while serving.

SIGHUP, `POST /api/admin/reload` (an admin key) or, with `server.watch_config`, a
change to the config file or a tenant's policy file reads the files again. A
config that does not load (bad YAML, a misspelled field, a missing policy file)
is refused with its error, logged and answered, and the config in use stays.
One that loads replaces, in one step, the keys, tenants, limits, models and
policies (dashboard sessions signed in with a removed key end): a request reads them once as it starts, so requests in flight finish
under the config they began with and the next one uses the new. Settings that
only a restart can change (storage, Redis, the listening socket and its connection and
body limits, the transport, logging, telemetry, the heartbeat) keep their running values; the reload names them.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gateway.access.auth import KeyRing
from gateway.access.dashboard_sessions import SessionSigner
from gateway.config import ConfigError, Settings, load_settings, tenant_policies
from gateway.services import Services
from gateway.upstream.deployments import RoutedUpstream
from policies.presets import PRESET_NAMES

log = logging.getLogger("gateway.reload")

# Read once at start: a changed value waits for a restart.
_RESTART_ONLY = ("storage", "redis", "log_level", "log_format", "access_log", "telemetry")
_RESTART_ONLY_SERVER = ("host", "port", "heartbeat_seconds", "direct_transport", "docs", "watch_config",
                        "shutdown_grace_seconds", "header_timeout_seconds", "body_timeout_seconds",
                        "max_connections", "max_buffered_request_bytes")


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    error: str | None = None
    policies: dict[str, str] | None = None  # tenant -> policy name and version now in use
    needs_restart: tuple[str, ...] = ()  # changed settings that keep their running values

    def as_dict(self) -> dict[str, Any]:
        return {"object": "config_reload", "ok": self.ok, "error": self.error, "policies": self.policies,
                "needs_restart": list(self.needs_restart)}


def _kept_for_restart(old: Settings, new: Settings) -> tuple[Settings, tuple[str, ...]]:
    """`new` with the restart-only settings of `old`, and which of them differed."""
    changed = [name for name in _RESTART_ONLY if getattr(old, name) != getattr(new, name)]
    changed += [f"server.{name}" for name in _RESTART_ONLY_SERVER
                if getattr(old.server, name) != getattr(new.server, name)]
    server = new.server.model_copy(update={name: getattr(old.server, name) for name in _RESTART_ONLY_SERVER})
    kept = new.model_copy(update={**{name: getattr(old, name) for name in _RESTART_ONLY}, "server": server})
    return kept, tuple(changed)


def watched_files(settings: Settings) -> list[Path]:
    """The config file and every policy file its tenants name."""
    files = [Path(settings.source)]
    for tenant in settings.tenants:
        if tenant.policy not in PRESET_NAMES:
            files.append(settings.resolve_path(tenant.policy))
    return files


def _stamp(files: list[Path]) -> tuple[tuple[str, float, int], ...]:
    out = []
    for file in files:
        try:
            found = file.stat()
            out.append((str(file), found.st_mtime, found.st_size))
        except OSError:
            out.append((str(file), -1.0, -1))
    return tuple(out)


def _end_sessions_of_removed_keys(current: Services, keyring: KeyRing) -> None:
    """The dashboard sessions signed in with config keys this reload dropped end now (the new keyring
    already signs nobody in with them; this keeps them ended if the key comes back)."""
    removed = current.keyring.key_ids() - keyring.key_ids()
    if not removed:
        return
    try:
        ended = current.store.end_dashboard_sessions_of_keys(removed)
    except Exception:  # the database is away: the keyring refuses those sessions all the same
        log.exception("config reload: ending the dashboard sessions of removed keys failed")
        return
    if ended:
        log.info("config reload: ended %d dashboard session(s) of removed keys", ended)


class Reloader:
    """Swaps `app.state.services` for one built from the files as they are now."""

    def __init__(self, app: Any, path: str) -> None:
        self.app = app
        self.path = path
        self._lock = threading.Lock()  # one reload at a time (signal, API and watch may meet)
        self._stamp = _stamp(watched_files(app.state.services.settings))

    def reload(self) -> ReloadResult:
        with self._lock:
            current: Services = self.app.state.services
            try:
                loaded = load_settings(self.path)
                policies = tenant_policies(loaded)
            except (ConfigError, OSError, ValueError) as exc:
                log.error("config reload refused, the running config stays: %s", exc,
                          extra={"fields": {"event": "config_reload", "ok": False, "error": str(exc)}})
                return ReloadResult(ok=False, error=str(exc))
            settings, needs_restart = _kept_for_restart(current.settings, loaded)
            sessions = current.sessions
            if settings.dashboard.session_secret != current.settings.dashboard.session_secret:
                sessions = SessionSigner(settings.dashboard.session_secret)
            upstream = current.upstream
            if isinstance(upstream, RoutedUpstream):
                upstream = upstream.with_settings(settings)  # deployments, retries and fallbacks as reloaded
            keyring = KeyRing(settings, current.keyring.database, current.clock)  # made keys: same cache
            self.app.state.services = replace(current, settings=settings, keyring=keyring,
                                              policies=policies, sessions=sessions, upstream=upstream)
            self._stamp = _stamp(watched_files(settings))
            _end_sessions_of_removed_keys(current, keyring)
            versions = {tenant: f"{policy.name} {policy.version_label}" for tenant, policy in policies.items()}
            log.info("config reloaded from %s", self.path, extra={"fields": {
                "event": "config_reload", "ok": True, "policies": versions, "needs_restart": list(needs_restart)}})
            if needs_restart:
                log.warning("config reload: %s changed but only take effect after a restart",
                            ", ".join(needs_restart))
            return ReloadResult(ok=True, policies=versions, needs_restart=needs_restart)

    def changed_on_disk(self) -> bool:
        return _stamp(watched_files(self.app.state.services.settings)) != self._stamp

    async def watch(self, every_seconds: float) -> None:
        """Reload whenever a watched file changes (a refused change is not retried until it changes again)."""
        while True:
            await asyncio.sleep(every_seconds)
            try:
                if self.changed_on_disk():
                    self._stamp = _stamp(watched_files(self.app.state.services.settings))
                    await asyncio.to_thread(self.reload)
            except Exception:
                log.exception("watching the config files failed")
