"""`gateway check-config`: every problem of a config in one run, with its line; warnings; `--connect`."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.commands.check_config import budget_warnings, connection_checks
from gateway.config import ConfigError, load_settings
from gateway.upstream.provider_names import PROVIDERS, provider_problem

# Three different mistakes, on known lines: an unset variable (line 5), a provider typo (line 7)
# and a misspelt policy preset (line 11); and a misspelt field (line 14).
BROKEN = """\
models:
  - name: fake
    litellm_params:
      model: openai/fake
      api_key: os.environ/CHECK_CONFIG_UNSET_KEY
  - name: typo
    litellm_params: {model: opnai/gpt-4o}
tenants:
  - id: acme
    api_keys: [sk-acme-1]
    policy: coding_agent
storage:
  url: sqlite:///./gateway.db
  inline_max_byte: 10
"""


def _check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "check-config", *args], capture_output=True, text=True,
                          timeout=180, env={**os.environ, **(env or {})})


def test_every_problem_is_named_with_its_line_in_one_run(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(BROKEN)
    os.environ.pop("CHECK_CONFIG_UNSET_KEY", None)
    done = _check("--config", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"gateway: config error: {path}: models[0].litellm_params.api_key (line 5): environment variable "
        "CHECK_CONFIG_UNSET_KEY is not set",
        f"gateway: config error: {path}: tenants[0].policy (line 11): 'coding_agent' is neither a preset "
        "(passthrough, default, coding-agent) nor a policy file; did you mean 'coding-agent'?",
        f"gateway: config error: {path}: storage.inline_max_byte (line 14): unknown field; "
        "did you mean 'inline_max_bytes'?",
        f"gateway: config error: {path}: models[1].litellm_params.model (line 7): 'opnai' is not a provider "
        "LiteLLM knows; did you mean 'openai'?",
    ]
    positional = _check(str(path))  # the older spelling still works
    assert positional.returncode == 2 and positional.stderr == done.stderr


def test_the_error_object_holds_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(BROKEN)
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert [(p.field, p.line) for p in caught.value.problems] == [
        ("models[0].litellm_params.api_key", 5), ("tenants[0].policy", 11), ("storage.inline_max_byte", 14),
        ("models[1].litellm_params.model", 7)]
    assert caught.value.field == "models[0].litellm_params.api_key"  # the first, as before


def test_provider_prefixes() -> None:
    assert provider_problem("openai/gpt-4o") is None and provider_problem("gpt-4o") is None
    assert provider_problem("anthropic/claude-*") is None and provider_problem("openrouter/a/b") is None
    assert provider_problem("my-org/llama", custom_llm_provider="openai") is None
    assert "did you mean 'anthropic'" in (provider_problem("antropic/claude") or "")
    assert provider_problem("zzqx/model") == "litellm_params.model: 'zzqx' is not a provider LiteLLM knows"


def test_the_provider_list_is_litellms() -> None:
    from gateway.upstream.litellm_client.base import litellm

    assert PROVIDERS == {getattr(p, "value", p) for p in litellm.provider_list}


def _config(tmp_path: Path, redis_url: str | None = None, budget: bool = True) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"""\
models:
  - name: demo
    litellm_params: {{model: openai/demo, mock_response: hi}}
  - name: priced
    litellm_params: {{model: openai/demo, input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}}
  - name: gpt
    litellm_params: {{model: openai/gpt-4o}}
tenants:
  - id: acme
    api_keys: [sk-acme-1]
    {"budget: {usd_per_day: 5}" if budget else ""}
  - id: beta
    api_keys: [sk-beta-1]
    models: [priced]
    budget: {{usd_per_month: 50}}
storage:
  url: sqlite:///./gateway.db
  blobs: {{dir: ./blobs}}
{f"redis: {{url: '{redis_url}'}}" if redis_url else ""}
""")
    return path


def test_a_budget_over_an_unpriced_model_is_warned_of(tmp_path: Path) -> None:
    from gateway.upstream.litellm_client.client import LiteLLMUpstream

    upstream = LiteLLMUpstream(direct_transport=False)
    settings = load_settings(_config(tmp_path))
    warnings = budget_warnings(settings, lambda params: upstream.prices(params) is not None)
    # acme may use every model: demo has no price (gpt-4o is in LiteLLM's map, `priced` has its own);
    # beta may use `priced` only
    assert len(warnings) == 1
    assert "tenants[0].budget: model 'demo' (demo#1, openai/demo) has no price" in warnings[0]
    done = _check("--config", str(_config(tmp_path)))
    assert done.returncode == 0 and "gateway: warning: " in done.stderr and "'demo'" in done.stderr
    quiet = _check("--config", str(_config(tmp_path, budget=False)))
    assert quiet.returncode == 0 and "warning" not in quiet.stderr


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connect_reports_each_service(tmp_path: Path, redis_url: str) -> None:
    reachable = {c.what.split()[0]: c.problem for c in connection_checks(load_settings(_config(tmp_path, redis_url)))}
    assert reachable == {"database": None, "redis": None, "blobs": None}
    dead = f"redis://127.0.0.1:{_dead_port()}/0"
    done = _check("--config", str(_config(tmp_path, dead)), "--connect")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[1] == f"database sqlite:///{tmp_path}/gateway.db: ok"
    assert lines[2].startswith(f"redis {dead}: FAILED: ") and "refused" in lines[2].lower()
    assert lines[3] == f"blobs folder {tmp_path}/blobs: ok"
