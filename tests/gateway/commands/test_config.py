"""Config loading: env references, and errors that name the file and the field."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, load_settings

REPO = Path(__file__).resolve().parents[3]

GOOD = {
    "models": [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": "http://127.0.0.1:18080/v1",
                                                    "api_key": "os.environ/UPSTREAM_KEY"}}],
    "tenants": [{"id": "acme", "api_keys": ["sk-acme-1"], "policy": "default"}],
    "admin_keys": ["sk-admin"],
    "storage": {"url": "sqlite:///./gateway.db"},
}


def write(tmp_path: Path, raw: object) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw) if not isinstance(raw, str) else raw)
    return path


def test_issue_shape_loads_with_env_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPSTREAM_KEY", "sk-from-env")
    settings = load_settings(write(tmp_path, GOOD))
    assert settings.model("fake").litellm_params["api_key"] == "sk-from-env"
    assert settings.storage_url() == f"sqlite:///{tmp_path}/gateway.db"


def test_blob_store_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPSTREAM_KEY", "x")
    monkeypatch.setenv("S3_SECRET", "secret-from-env")
    assert load_settings(write(tmp_path, GOOD)).storage.blob_folder == "./blobs"
    assert load_settings(write(tmp_path, {**GOOD, "storage": {"blob_dir": "./old"}})).storage.blob_folder == "./old"
    settings = load_settings(write(tmp_path, {**GOOD, "storage": {"blobs": {"dir": "./new"}}}))
    assert settings.storage.blob_folder == "./new"
    s3 = {"backend": "s3", "bucket": "b", "access_key_id": "AK", "secret_access_key": "os.environ/S3_SECRET"}
    blobs = load_settings(write(tmp_path, {**GOOD, "storage": {"blobs": s3}})).storage.blobs
    assert blobs.backend == "s3" and blobs.secret_access_key == "secret-from-env"


def test_example_config_is_valid() -> None:
    settings = load_settings(REPO / "config.example.yaml")
    demo = settings.model("demo")
    assert demo is not None
    # priced (a demo price), so the first run's money figures are not all $0
    assert demo.litellm_params["input_cost_per_token"] > 0 and demo.litellm_params["output_cost_per_token"] > 0


@pytest.mark.parametrize("mutate, field, words", [
    (lambda c: c["models"][0]["litellm_params"].pop("model"), "models[0].litellm_params.model", "is required"),
    (lambda c: c["tenants"][0].update(api_keys=[]), "tenants[0].api_keys", "at least 1"),
    (lambda c: c["tenants"][0].update(policy="nope"), "tenants[0].policy", "neither a preset"),
    (lambda c: c["tenants"][0].update(api_keys=["sha256:xyz"]), "tenants[0].api_keys", "64 lowercase hex"),
    (lambda c: c.update(tenants=c["tenants"] * 2), "tenants", "duplicate tenant"),
    (lambda c: c["storage"].update(url="mysql://x"), "storage.url", "sqlite"),
    (lambda c: c.update(colour="blue"), "colour", "unknown field"),
    # a misspelt field is named, with the spelling it is close to, before the field it leaves missing
    (lambda c: c.update(tenantz=c.pop("tenants")), "tenantz", "unknown field; did you mean 'tenants'?"),
    (lambda c: c["tenants"][0].update(polciy="default"), "tenants[0].polciy", "did you mean 'policy'?"),
    (lambda c: c.update(server={"prot": 1}), "server.prot", "did you mean 'port'?"),
    (lambda c: c.pop("models"), "models", "required"),
    (lambda c: c["tenants"][0].update(models=["gpt-9"]), "tenants", "unknown model"),
    (lambda c: c["storage"].update(blobs={"backend": "s3"}), "storage.blobs.bucket", "required for backend: s3"),
    (lambda c: c["storage"].update(blobs={"backend": "gcs"}), "storage.blobs.backend", "'directory' or 's3'"),
    (lambda c: c["storage"].update(blobs={"bucket": "b"}), "storage.blobs.bucket", "only for backend: s3"),
    (lambda c: c["storage"].update(blobs={"backend": "s3", "bucket": "b", "dir": "./b"}), "storage.blobs.dir",
     "only for backend: directory"),
    (lambda c: c["storage"].update(blobs={"backend": "s3", "bucket": "b", "access_key_id": "AK"}),
     "storage.blobs.secret_access_key", "together, or neither"),
    (lambda c: c["storage"].update(blob_dir="./a", blobs={"dir": "./b"}), "storage.blobs", "not both"),
    (lambda c: c["storage"].update(blobs={"backend": "s3", "buckit": "b"}), "storage.blobs.buckit",
     "did you mean 'bucket'?"),
    (lambda c: c.update(redis={"url": "redis://cache", "when_down": "ignore"}), "redis.when_down",
     "'local' or 'refuse'"),
    (lambda c: c.update(server={"max_body_bytes": 1000, "max_buffered_request_bytes": 999}),
     "server.max_buffered_request_bytes", "less than max_body_bytes (1000)"),
    (lambda c: c.update(server={"header_timeout_seconds": 0}), "server.header_timeout_seconds", "greater than 0"),
    (lambda c: c.update(server={"max_connections": 0}), "server.max_connections", "greater than 0"),
])
def test_bad_config_names_file_and_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutate, field, words) -> None:
    monkeypatch.setenv("UPSTREAM_KEY", "x")
    raw = yaml.safe_load(yaml.safe_dump(GOOD))
    mutate(raw)
    path = write(tmp_path, raw)
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert caught.value.path == str(path)
    assert caught.value.field == field
    assert words in caught.value.problem
    assert str(path) in str(caught.value) and field in str(caught.value)


def test_missing_env_var_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UPSTREAM_KEY", raising=False)
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, GOOD))
    assert caught.value.field == "models[0].litellm_params.api_key"
    assert "UPSTREAM_KEY" in caught.value.problem


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, "models:\n  - name: [unclosed\n"))
    assert caught.value.field.startswith("line ")


def test_hashed_keys_are_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPSTREAM_KEY", "x")
    raw = yaml.safe_load(yaml.safe_dump(GOOD))
    raw["tenants"][0]["api_keys"] = ["sha256:" + hashlib.sha256(b"sk-secret").hexdigest()]
    assert load_settings(write(tmp_path, raw)).tenants[0].api_keys[0].startswith("sha256:")


def test_check_config_command(tmp_path: Path) -> None:
    gateway = [sys.executable, "-m", "gateway"]
    ok = subprocess.run([*gateway, "check-config", str(REPO / "config.example.yaml")], capture_output=True, text=True)
    assert ok.returncode == 0 and "ok" in ok.stdout
    bad = write(tmp_path, {**GOOD, "tenants": []})
    env = {**os.environ, "UPSTREAM_KEY": "x"}
    failed = subprocess.run([*gateway, "check-config", str(bad)], capture_output=True, text=True, env=env)
    assert failed.returncode == 2
    assert f"{bad}: tenants (line " in failed.stderr


def test_litellm_proxy_config_is_recognised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LITELLM_MASTER_KEY", raising=False)
    path = write(tmp_path, {"model_list": [{"model_name": "gpt-4o", "litellm_params": {"model": "openai/gpt-4o"}}],
                            "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"}})
    with pytest.raises(ConfigError) as caught:
        load_settings(path)  # named before any os.environ/ reference is read
    assert caught.value.problem == (f"this looks like a LiteLLM Proxy config (model_list); "
                                    f"convert it with `gateway migrate-config {path}`")
    checked = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(path)],
                             capture_output=True, text=True)
    assert checked.returncode == 2 and f"convert it with `gateway migrate-config {path}`" in checked.stderr


def test_readme_policy_example_is_valid() -> None:
    from policies.policy import policy_from_mapping

    readme = (REPO / "README.md").read_text()
    block = readme.split("## Policies", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    policy = policy_from_mapping(yaml.safe_load(block), "README.md")
    assert policy.name == "support-agent" and policy.rule_for("gmail_send").privacy == "restricted"
    assert policy.rule_for("get_stock_price").stale_after == 15 * 60


def _settings_field_exists(path: list[str | int]) -> bool:
    """Whether a config path (`server.max_body_bytes`, `tenants[0].budget`) is a field of Settings."""
    from typing import get_args

    from pydantic import BaseModel

    from gateway.config import Settings

    model: Any = Settings
    for part in path:
        if isinstance(part, int):
            continue
        if model is dict:
            return True  # litellm_params and other free mappings take any key
        field = model.model_fields.get(part)
        if field is None:
            return False
        candidates = [field.annotation, *get_args(field.annotation)]
        candidates += [inner for c in candidates for inner in get_args(c)]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)),
                     dict if any(c is dict or getattr(c, "__origin__", None) is dict for c in candidates) else None)
    return True


# Backticked words of the README shaped like config paths that are not: OpenTelemetry attributes.
_NOT_CONFIG = {"server.address"}


def test_every_config_field_the_readme_names_exists() -> None:
    readme = (REPO / "README.md").read_text()
    shape = yaml.safe_load(readme.split("See `config.example.yaml`; the shape:", 1)[1]
                           .split("```yaml", 1)[1].split("```", 1)[0])
    paths: list[list[str | int]] = []

    def walk(value: object, path: list[str | int]) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                paths.append([*path, key])
                walk(inner, [*path, key])
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            walk(value[0], [*path, 0])

    walk(shape, [])
    sections = "server|storage|redis|dashboard|telemetry|retention|router|tenants|models"
    for reference in re.findall(rf"`((?:{sections})(?:\[\d*\])?(?:\.[A-Za-z_]\w*(?:\[\d*\])?)+)`", readme):
        if reference not in _NOT_CONFIG:
            paths.append([p for p in re.split(r"[.\[\]]+", reference) if p])
    assert len(paths) > 60
    missing = [".".join(map(str, p)) for p in paths if not _settings_field_exists(p)]
    assert missing == []


def test_the_field_check_finds_a_field_that_is_not_there() -> None:
    assert _settings_field_exists(["storage", "encryption_key"]) and _settings_field_exists(["tenants", 0, "budget"])
    assert not _settings_field_exists(["storage", "encryption_keys"])
    assert not _settings_field_exists(["server", "max_body_byte"])


@pytest.mark.parametrize("name, model", [
    ("claude-sonnet-4-5", "anthropic/claude-sonnet-4-5"), ("claude-3.5_x:latest", "anthropic/claude-3.5_x:latest"),
    ("claude-", "anthropic/claude-"),
])
def test_a_wildcard_fills_in_a_plain_name(name: str, model: str) -> None:
    from gateway.config import parse_settings

    settings = parse_settings({**GOOD, "models": [
        {"name": "claude-*", "litellm_params": {"model": "anthropic/claude-*", "api_key": "k"}}]})
    assert settings.model(name).litellm_params["model"] == model


@pytest.mark.parametrize("name", ["claude-a/b", "claude-../../v1/evil?", "claude-a?b", "claude-a#b", "claude-a%2fb",
                                  "claude-a b", "claude-..", "claude-x..y", "claude-a\nb", "claude-ä", "claude-a\\b"])
def test_a_wildcard_matches_no_name_that_is_not_plain(name: str) -> None:
    """What a `*` stands for goes into the provider's URL path: only letters, digits, `.`, `_`, `-`, `:`."""
    from gateway.config import parse_settings

    settings = parse_settings({**GOOD, "models": [
        {"name": "claude-*", "litellm_params": {"model": "anthropic/claude-*", "api_key": "k"}},
        {"name": "*", "litellm_params": {"model": "openai/*", "api_key": "k"}}]})
    assert settings.model(name) is None and settings.deployments(name) == []
