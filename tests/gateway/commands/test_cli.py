"""The CLI's own answers: `--version`, and `tenant purge` refusing what it cannot confirm or does not know."""
from __future__ import annotations

import io
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from gateway.app import build_store
from gateway.cli import main
from gateway.config import load_settings


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "models": [{"name": "demo", "litellm_params": {"model": "openai/demo", "mock_response": "hi"}}],
        "tenants": [{"id": "acme", "api_keys": ["sk-acme-1"], "policy": "default"}],
        "storage": {"url": f"sqlite:///{tmp_path / 'gateway.db'}", "blobs": {"dir": str(tmp_path / "blobs")}},
    }))
    return path


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _audit_entries(config: Path, tenant: str) -> list:
    store = build_store(load_settings(config))
    try:
        store.create_schema()
        return store.purge_history(tenant)
    finally:
        store.engine.dispose()


def test_version() -> None:
    done = subprocess.run([sys.executable, "-m", "gateway", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"gateway {version('context-gateway')}"


def test_purge_without_a_terminal_asks_for_yes(config: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("acme\n"))  # not a terminal: no prompt, no EOFError
    assert main(["tenant", "purge", "acme", "--config", str(config)]) == 2
    assert "pass --yes" in capsys.readouterr().err
    assert _audit_entries(config, "acme") == []


def test_purge_of_an_unknown_tenant_is_refused_unless_told(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tenant", "purge", "nobody", "--config", str(config), "--yes"]) == 1
    assert "is not in the config and has no records" in capsys.readouterr().err
    assert _audit_entries(config, "nobody") == []
    assert main(["tenant", "purge", "nobody", "--config", str(config), "--yes", "--unknown"]) == 0
    assert len(_audit_entries(config, "nobody")) == 1


def test_purge_of_a_configured_tenant_asks_at_a_terminal(config: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", _Terminal("not-acme\n"))
    assert main(["tenant", "purge", "acme", "--config", str(config)]) == 1
    assert "purge cancelled" in capsys.readouterr().err and _audit_entries(config, "acme") == []
    monkeypatch.setattr(sys, "stdin", _Terminal("acme\n"))
    assert main(["tenant", "purge", "acme", "--config", str(config)]) == 0
    assert "purged tenant 'acme'" in capsys.readouterr().out and len(_audit_entries(config, "acme")) == 1
