"""Fixtures shared by the gateway tests beyond the root conftest."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import yaml

from testkit.gateway import OTHER_TENANT_KEY, TENANT_KEY, RunningGateway, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream


@pytest.fixture
def rehydration_gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    """The gateway under the rehydration tests' policy (tests/gateway/pipeline/test_rehydration.py), two tenants."""
    from tests.gateway.pipeline.test_rehydration import POLICY

    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "policy.yaml"},
               {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "policy": "policy.yaml"}]
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, tenants=tenants), fake)
    yield running
    server.stop()


@pytest.fixture(scope="module")
def module_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """The default gateway (SQLite, a fake upstream of its own) shared by the tests of one module."""
    tmp = tmp_path_factory.mktemp("gateway")
    with FakeUpstream() as fake:
        running, server = start_gateway(settings_for(fake.api_base, f"sqlite:///{tmp / 'gateway.db'}", tmp), fake)
        try:
            yield running
        finally:
            server.stop()
