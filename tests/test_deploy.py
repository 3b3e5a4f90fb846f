"""The deploy/ configs load with the gateway's own validation (no container engine runs here)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.config import parse_settings, tenant_policies

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
ENV = {"OPENAI_API_KEY": "sk-x", "ACME_KEY": "sk-acme", "GATEWAY_ADMIN_KEY": "sk-admin",
       "GATEWAY_SESSION_SECRET": "s3cret", "DATABASE_URL": "postgresql+psycopg://u@db/gateway"}


@pytest.mark.parametrize("raw", [
    yaml.safe_load((DEPLOY / "config.compose.yaml").read_text()),
    yaml.safe_load(yaml.safe_load_all((DEPLOY / "k8s" / "gateway.yaml").read_text()).__next__()["data"]["config.yaml"]),
], ids=["compose", "k8s"])
def test_deploy_configs_are_valid(raw: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    settings = parse_settings(raw, "deploy", str(DEPLOY))
    assert settings.storage.url.startswith("postgresql")
    assert tenant_policies(settings)["acme"].name == "coding-agent"


def test_compose_mounts_the_config_the_image_reads() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    volumes = compose["services"]["gateway"]["volumes"]
    assert "./config.compose.yaml:/etc/gateway/config.yaml:ro" in volumes
    assert "/etc/gateway/config.yaml" in (DEPLOY / "Dockerfile").read_text()
