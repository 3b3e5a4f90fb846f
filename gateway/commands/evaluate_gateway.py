"""The gateway `gateway evaluate` asks through: the whole app, in this process, under two policies.

Rather than re-implement the request path (projection, the rehydration tool's hidden rounds, routing,
the LiteLLM client), the command builds the real app (`create_app`) from the user's config with only
what it needs of it (the model entries and the router), on a temporary SQLite database, with two
tenants, one per policy (arm `a`: `--policy`, arm `b`: `--against`; each policy's own evaluation turned
off: no conversation held out of it, no shadow sent), and serves it on a loopback port for the length
of the run. Each turn is sent to both tenants as a non-streaming Chat Completions
request; the answers and the gateway's token headers come back as `Answer`s.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml

from gateway.app import create_app
from gateway.config import ConfigError, Settings, load_policy
from gateway.settings.server import RedisSettings, TelemetrySettings
from gateway.settings.storage import StorageSettings
from gateway.settings.tenants import TenantSettings
from policies.presets import PRESET_NAMES

ARMS = ("a", "b")
ARM_KEYS = {"a": "sk-evaluate-arm-a", "b": "sk-evaluate-arm-b"}
UNPROJECTED = "none"  # --against none: the transcript as sent (the passthrough preset)
_START_SECONDS = 120  # a loaded machine takes a while to import LiteLLM
_REQUEST_SECONDS = 600  # one turn, hidden rehydration rounds included


class EvaluateError(ValueError):
    """A usage error, said in one line (the command exits 2)."""


def policy_reference(value: str, flag: str) -> str:
    """A preset's name, or an existing policy file's absolute path; `none` is the passthrough preset."""
    if value == UNPROJECTED:
        return "passthrough"
    if value in PRESET_NAMES:
        return value
    if Path(value).is_file():
        return str(Path(value).resolve())
    raise EvaluateError(f"{flag} {value!r} is neither a preset ({', '.join(PRESET_NAMES)}), `none`, "
                        "nor a policy file")


def arm_settings(settings: Settings, model: str, references: dict[str, str], workdir: Path) -> Settings:
    """`settings` reduced to the models and router, on a database of its own in `workdir`, with one tenant
    per arm. Its policies are loaded here, so a bad policy file is told before anything starts."""
    if settings.model(model) is None:
        names = ", ".join(sorted({m.name for m in settings.models}))
        raise EvaluateError(f"--model {model!r} is no model of {settings.source} (it has: {names})")
    tenants = [TenantSettings(id=f"evaluate-{arm}", api_keys=[ARM_KEYS[arm]],
                              policy=_arm_policy_file(settings, arm, reference, workdir))
               for arm, reference in references.items()]
    storage = StorageSettings(url=f"sqlite:///{workdir / 'evaluate.db'}", blob_dir=str(workdir / "blobs"))
    return settings.model_copy(update={"tenants": tenants, "admin_keys": [], "storage": storage,
                                       "redis": RedisSettings(), "telemetry": TelemetrySettings(),
                                       "access_log": False, "log_level": "warning"})


def _arm_policy_file(settings: Settings, arm: str, reference: str, workdir: Path) -> str:
    """The arm's policy written to `workdir` with its own evaluation turned off: every conversation of the
    arm is projected under it (no held-out share), and no shadow request is sent on the side."""
    try:
        policy = load_policy(reference, settings, "--policy" if arm == "a" else "--against")
    except ConfigError as error:
        raise EvaluateError(error.problems[0].one_line()) from None
    data = policy.model_dump(mode="json")
    data["evaluation"] = {**data.get("evaluation", {}), "holdout_share": 0.0, "shadow_share": 0.0}
    path = workdir / f"policy-{arm}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(path)


@dataclass(frozen=True)
class Answer:
    message: dict[str, Any] | None  # the assistant message (None: the request failed)
    tokens_original: int | None = None
    tokens_forwarded: int | None = None
    error: str | None = None


class LocalGateway:
    """The app of `settings` on 127.0.0.1 in a thread, for a `with` block."""

    def __init__(self, settings: Settings) -> None:
        config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=0, log_level="warning",
                                lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="gateway-evaluate", daemon=True)
        self.http: httpx.Client | None = None

    def __enter__(self) -> "LocalGateway":
        self.thread.start()
        deadline = time.monotonic() + _START_SECONDS
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.server.should_exit = True
                raise EvaluateError("the evaluation's gateway did not start (its log above says why)")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=_REQUEST_SECONDS)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.http is not None:
            self.http.close()
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def ask(self, arm: str, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Answer:
        """The next message under arm `arm`'s policy for the request `messages`."""
        assert self.http is not None, "inside a with block"
        body: dict[str, Any] = {"model": model, "messages": messages, "stream": False}
        if tools:
            body["tools"] = tools
        try:
            response = self.http.post("/v1/chat/completions", json=body,
                                      headers={"Authorization": f"Bearer {ARM_KEYS[arm]}"})
        except httpx.HTTPError as error:
            return Answer(None, error=f"{type(error).__name__}: {error}")
        if response.status_code != 200:
            return Answer(None, error=f"HTTP {response.status_code}: {_error_text(response)}")
        try:
            message = response.json()["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            return Answer(None, error="an answer without choices[0].message")
        return Answer(message, _header_int(response, "x-gateway-tokens-original"),
                      _header_int(response, "x-gateway-tokens-forwarded"))


def _header_int(response: httpx.Response, name: str) -> int | None:
    value = response.headers.get(name)
    return int(value) if value is not None and value.isdigit() else None


def _error_text(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        text = error.get("message") if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError):
        text = response.text
    return " ".join(str(text).split())[:300]
