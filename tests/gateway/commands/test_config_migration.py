"""`gateway migrate-config`: a LiteLLM Proxy config.yaml in, this gateway's config and the notes out."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.commands.migrate_config import migrate
from gateway.config import load_settings

# As LiteLLM Proxy users write them: several providers, env references, two deployments of
# gpt-4o, router and litellm settings that overlap, callbacks, a cache and keys of LiteLLM's own.
LITELLM_CONFIG = """\
model_list:
  - model_name: gpt-4o
    litellm_params:
      model: azure/gpt-4o-eu
      api_base: os.environ/AZURE_API_BASE_EU
      api_key: os.environ/AZURE_API_KEY_EU
      api_version: "2024-08-01-preview"
      rpm: 600
    model_info:
      id: azure-eu
      base_model: azure/gpt-4o
  - model_name: gpt-4o
    litellm_params:
      model: openai/gpt-4o
      api_key: os.environ/OPENAI_API_KEY
      tpm: 2000000
  - model_name: claude-sonnet
    litellm_params:
      model: anthropic/claude-sonnet-4-5
      api_key: os.environ/ANTHROPIC_API_KEY
    model_info:
      mode: chat
      input_cost_per_token: 0.000003
      output_cost_per_token: 0.000015
  - model_name: llama-local
    litellm_params:
      model: ollama/llama3.1
      api_base: http://localhost:11434
  - litellm_params:
      model: openai/gpt-4o-mini

router_settings:
  routing_strategy: usage-based-routing-v2
  num_retries: 3
  cooldown_time: 30
  redis_host: os.environ/REDIS_HOST
  enable_pre_call_checks: true

litellm_settings:
  num_retries: 5
  request_timeout: 120
  fallbacks: [{"gpt-4o": ["claude-sonnet"]}]
  context_window_fallbacks: [{"llama-local": ["gpt-4o", "gpt-4o-long"]}]
  drop_params: true
  set_verbose: false
  success_callback: ["langfuse"]
  callbacks: ["prometheus"]
  cache: true
  cache_params: {type: redis}

general_settings:
  master_key: os.environ/LITELLM_MASTER_KEY
  database_url: postgresql://llmproxy:secret@db:5432/litellm
  alerting: ["slack"]
  store_model_in_db: true

environment_variables:
  LANGFUSE_PUBLIC_KEY: pk-lf-visible-value
  LANGFUSE_SECRET_KEY: sk-lf-secret-value

mcp_servers:
  github: {url: https://example.invalid/mcp}
"""

# Nothing LiteLLM routes across deployments: loads in this gateway as it stands.
SIMPLE_LITELLM_CONFIG = """\
model_list:
  - model_name: fake
    litellm_params:
      model: openai/fake
      api_base: http://127.0.0.1:18080/v1
      api_key: os.environ/UPSTREAM_KEY
  - model_name: claude-*
    litellm_params:
      model: anthropic/claude-*
      api_key: os.environ/ANTHROPIC_API_KEY
general_settings:
  master_key: sk-litellm-master
litellm_settings:
  drop_params: true
"""


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["migrate-config", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def notes_of(stderr: str) -> list[str]:
    return [line[len("gateway: note: "):] for line in stderr.splitlines() if line.startswith("gateway: note: ")]


def test_realistic_litellm_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "litellm.yaml"
    source.write_text(LITELLM_CONFIG)
    out_file = tmp_path / "gateway.yaml"
    code, stdout, stderr = run_cli(capsys, str(source), "-o", str(out_file))
    assert code == 0 and stdout == ""
    text = out_file.read_text()
    config = yaml.safe_load(text)

    # Both gpt-4o deployments stay, in order, params and env references untouched; the entry
    # without a model_name is skipped; model_info prices move into litellm_params.
    assert [m["name"] for m in config["models"]] == ["gpt-4o", "gpt-4o", "claude-sonnet", "llama-local"]
    assert config["models"][0]["litellm_params"] == {
        "model": "azure/gpt-4o-eu", "api_base": "os.environ/AZURE_API_BASE_EU",
        "api_key": "os.environ/AZURE_API_KEY_EU", "api_version": "2024-08-01-preview", "rpm": 600}
    assert config["models"][1]["litellm_params"]["tpm"] == 2000000
    assert config["models"][2]["litellm_params"] == {
        "model": "anthropic/claude-sonnet-4-5", "api_key": "os.environ/ANTHROPIC_API_KEY",
        "input_cost_per_token": 0.000003, "output_cost_per_token": 0.000015}
    assert config["models"][0]["id"] == "azure-eu"  # model_info.id: the deployment's id here too
    assert all(set(m) == {"name", "litellm_params"} for m in config["models"][1:])

    # router_settings win over litellm_settings where both say; the rest comes from litellm_settings.
    # A fallback to a model the config does not have is left out.
    assert config["router"] == {
        "routing_strategy": "usage-based-routing-v2", "num_retries": 3, "timeout": 120, "cooldown_time": 30,
        "fallbacks": [{"gpt-4o": ["claude-sonnet"]}],
        "context_window_fallbacks": [{"llama-local": ["gpt-4o"]}]}
    assert config["tenants"] == [{"id": "default", "api_keys": ["os.environ/GATEWAY_API_KEY"], "policy": "default"}]
    assert config["admin_keys"] == ["os.environ/LITELLM_MASTER_KEY"]
    assert config["storage"] == {"url": "postgresql+psycopg://llmproxy:secret@db:5432/litellm"}
    assert list(config) == ["models", "router", "tenants", "admin_keys", "storage"]

    notes = notes_of(stderr)
    for key in ["model_list[0] (gpt-4o).model_info (base_model)", "model_list[2] (claude-sonnet).model_info (mode)",
                "model_list[4]: skipped: no model_name",
                "litellm_settings.num_retries: not carried; router_settings.num_retries is used instead",
                "router_settings.redis_host: not carried", "router_settings.enable_pre_call_checks: not carried",
                "litellm_settings.drop_params: not carried", "litellm_settings.set_verbose: not carried",
                "litellm_settings.success_callback: not carried", "litellm_settings.callbacks: not carried",
                "litellm_settings.cache: not carried", "litellm_settings.cache_params: not carried",
                "general_settings.alerting: not carried", "general_settings.store_model_in_db: not carried",
                "environment_variables (LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY): not carried",
                "mcp_servers: not carried", "router.context_window_fallbacks names 'gpt-4o-long', which no model",
                "tenants: LiteLLM keeps its virtual keys in its database", "admin_keys: LiteLLM's master_key"]:
        assert sum(note.startswith(key) for note in notes) == 1, (key, notes)
    assert any("GATEWAY_API_KEY" in note for note in notes)
    # one line per key left behind, and the values of the environment never printed
    assert len(notes) == 20, notes
    assert "secret-value" not in stderr and "secret-value" not in text
    # the notes travel with the file, as comments above the config
    assert all(f"#   - {note}" in text for note in notes)
    assert f"wrote {out_file} (4 model entries, 20 notes)" in stderr


def test_output_without_deployments_or_router_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "litellm.yaml"
    source.write_text(SIMPLE_LITELLM_CONFIG)
    gateway = [sys.executable, "-m", "gateway"]
    converted = subprocess.run([*gateway, "migrate-config", str(source)], capture_output=True, text=True)
    assert converted.returncode == 0, converted.stderr
    config = yaml.safe_load(converted.stdout)
    assert "router" not in config  # litellm_settings.drop_params alone maps to nothing there
    assert notes_of(converted.stderr)[0].startswith("litellm_settings.drop_params: not carried")

    target = tmp_path / "gateway.yaml"
    target.write_text(converted.stdout)
    env = {**os.environ, "UPSTREAM_KEY": "sk-up", "ANTHROPIC_API_KEY": "sk-ant", "GATEWAY_API_KEY": "sk-tenant"}
    for name in ("UPSTREAM_KEY", "ANTHROPIC_API_KEY", "GATEWAY_API_KEY"):
        monkeypatch.setenv(name, env[name])
    settings = load_settings(target)
    assert settings.model("fake").litellm_params["api_key"] == "sk-up"
    assert settings.model("claude-haiku-4-5").litellm_params["model"] == "anthropic/claude-haiku-4-5"
    assert settings.tenants[0].api_keys == ["sk-tenant"] and settings.admin_keys == ["sk-litellm-master"]
    assert settings.storage_url() == f"sqlite:///{tmp_path}/gateway.db"

    checked = subprocess.run([*gateway, "check-config", str(target)], capture_output=True, text=True, env=env)
    assert checked.returncode == 0, checked.stderr
    assert "ok (2 models, 1 tenants, storage sqlite)" in checked.stdout


@pytest.mark.parametrize("content, words", [
    ("model_list: [unclosed\n", "not valid YAML"),
    ("- model_name: a\n", "a YAML mapping with a model_list"),
    ("", "a YAML mapping with a model_list"),
    ("general_settings: {master_key: sk-1}\n", "model_list: no model_list entries"),
    ("model_list: []\n", "model_list: no model_list entries"),
    ("model_list:\n  - model_name: a\n", "model_list: no entry has a model_name and litellm_params.model"),
    ("model_list:\n  - {model_name: a, litellm_params: {model: openai/a}}\nrouter_settings: [1]\n",
     "router_settings: must be a mapping"),
])
def test_what_cannot_be_converted_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          content: str, words: str) -> None:
    source = tmp_path / "litellm.yaml"
    source.write_text(content)
    code, stdout, stderr = run_cli(capsys, str(source))
    assert code == 2 and stdout == ""
    assert stderr.startswith(f"gateway: config error: {source}") and words in stderr


def test_missing_file_and_overwriting_the_source_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, stderr = run_cli(capsys, str(tmp_path / "absent.yaml"))
    assert code == 2 and "cannot read the file" in stderr
    source = tmp_path / "litellm.yaml"
    source.write_text(SIMPLE_LITELLM_CONFIG)
    code, _, stderr = run_cli(capsys, str(source), "-o", str(source))
    assert code == 2 and "write the result elsewhere" in stderr
    assert source.read_text() == SIMPLE_LITELLM_CONFIG


def test_database_url_from_the_environment_stays_a_reference() -> None:
    raw = {"model_list": [{"model_name": "a", "litellm_params": {"model": "openai/a"}}],
           "general_settings": {"database_url": "os.environ/DATABASE_URL"}}
    migration = migrate(raw, "litellm.yaml")
    assert migration.config["storage"] == {"url": "os.environ/DATABASE_URL"}
    assert any(n.startswith("storage.url: reads DATABASE_URL, which must now start with postgresql+psycopg://")
               for n in migration.notes)


def test_router_settings_alone_and_postgres_scheme() -> None:
    raw = {"model_list": [{"model_name": "a", "litellm_params": {"model": "openai/a"}}],
           "router_settings": {"retry_after": 5, "allowed_fails": 1, "timeout": None},
           "general_settings": {"database_url": "postgres://u@h/db"}}
    migration = migrate(raw, "litellm.yaml")
    assert migration.config["router"] == {"retry_after": 5, "timeout": None, "allowed_fails": 1}
    assert migration.config["storage"]["url"] == "postgresql+psycopg://u@h/db"



def test_the_converted_realistic_config_loads_with_its_deployments_and_router(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Deployments, router settings and fallbacks as converted are what the gateway serves."""
    source = tmp_path / "litellm.yaml"
    source.write_text(LITELLM_CONFIG.replace("      rpm: 600", "      rpm: 600\n      max_budget: 100")
                      .replace("usage-based-routing-v2", "provider-budget-routing"))
    out_file = tmp_path / "gateway.yaml"
    code, _, stderr = run_cli(capsys, str(source), "-o", str(out_file))
    assert code == 0
    assert "litellm_params.max_budget: not carried (budgets are set per tenant" in stderr
    assert "router_settings.routing_strategy (provider-budget-routing): not carried (served: " in stderr
    for name in ("AZURE_API_BASE_EU", "AZURE_API_KEY_EU", "OPENAI_API_KEY", "ANTHROPIC_API_KEY",
                 "LITELLM_MASTER_KEY", "GATEWAY_API_KEY"):
        monkeypatch.setenv(name, f"value-of-{name.lower()}")
    settings = load_settings(out_file)
    assert [i for i, _ in settings.deployments("gpt-4o")] == ["azure-eu", "gpt-4o#2"]  # model_info.id kept
    assert settings.router.num_retries == 3 and settings.router.fallbacks_for("gpt-4o") == ["claude-sonnet"]
    assert settings.router.fallbacks_for("llama-local", context_window=True) == ["gpt-4o"]
