"""Retention through the running gateway: `gateway gc` with the clock moved forward keeps what a
live conversation's projection names, collects idle ones, and leaves `/api/savings` as it was;
a tenant purge leaves nothing of the tenant but its audit entry."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from sqlalchemy import String, Text, select

from gateway.app import create_app
from gateway.cli import main
from gateway.config import load_settings
from gateway.ops.housekeeping import Housekeeping
from storage.schema import Base
from testkit.gateway import ADMIN_KEY, OTHER_TENANT_KEY, TENANT_KEY, RunningGateway
from testkit.fake_upstream import FakeUpstream, ServerThread
from tests.gateway.pipeline.test_rehydration import (
    FILLER,
    INVOICE,
    POLICY,
    TOOLS,
    call,
    invoice_conversation,
    rehydrate,
    result,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)
OTHER_INVOICE = INVOICE.replace("INV-7", "INV-9").replace("48,213.77", "1,002.00")


class Clock:
    def __init__(self) -> None:
        self.moment = T0

    def __call__(self) -> float:
        return self.moment.timestamp()


def write_config(tmp_path: Path, api_base: str, storage_url: str) -> Path:
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    config = {
        "models": [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": api_base,
                                                        "api_key": "sk-upstream"}}],
        "tenants": [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "policy.yaml"},
                    {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "policy": "policy.yaml",
                     "retention": {"artifacts": None}}],
        "admin_keys": [ADMIN_KEY],
        "storage": {"url": storage_url, "blob_dir": str(tmp_path / "blobs"), "inline_max_bytes": 1024},
        # the schedule is off: these tests run the collection themselves, at the time they choose
        "retention": {"artifacts": "30d", "memories": "30d", "assemblies": "30d", "runs": "30d",
                      "gc_interval_seconds": None},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def gateway(fake: FakeUpstream, storage_url: str, tmp_path: Path, clock: Clock) -> Iterator[RunningGateway]:
    settings = load_settings(write_config(tmp_path, fake.api_base, storage_url))
    app = create_app(settings, clock=clock)
    server = ServerThread(app).start()
    yield RunningGateway(url=server.url, settings=settings, app=app, fake=fake)
    server.stop()


def send(gateway: RunningGateway, messages: list[dict], key: str = TENANT_KEY, label: str | None = None) -> dict:
    gateway.fake.script_message({"role": "assistant", "content": "noted"})
    with gateway.client(key=key) as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": messages},
                             headers={"x-gateway-session": label} if label else {})
        assert response.status_code == 200, response.text
        return http.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()


def forwarded(gateway: RunningGateway) -> list[dict]:
    return gateway.fake.requests[-1]["body"]["messages"]


def gc(config: Path, now: datetime, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    capsys.readouterr()
    assert main(["gc", "--config", str(config), "--now", now.isoformat(), *extra]) == 0
    return capsys.readouterr().out


def counts(output: str) -> dict[str, int]:
    return {line.split()[0]: int(line.split()[1]) for line in output.splitlines()[1:]}


def blob_files(tmp_path: Path) -> set[str]:
    return {p.name for p in (tmp_path / "blobs").rglob("*") if p.is_file() and not p.name.startswith(".")}


def test_gc_keeps_what_a_live_conversation_names(gateway: RunningGateway, clock: Clock, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    live = invoice_conversation() + [{"role": "assistant", "content": "noted"},
                                     {"role": "user", "content": "Now the next invoice."}]
    first = send(gateway, live, label="live")
    memory = next(d for d in first["assembly"]["decisions"] if d["index"] == 3)
    assert memory["action"] == "compacted"  # the invoice went upstream as a memory
    idle = [m if m.get("content") != INVOICE else result("c1", OTHER_INVOICE) for m in invoice_conversation()]
    idle_record = send(gateway, idle, label="idle")
    clock.moment = T0 + 20 * DAY
    live += [call("c3", "run_query", q="x"), result("c3", "query result\n" + FILLER)]
    send(gateway, live, label="live")
    before = forwarded(gateway)
    with gateway.client(key=ADMIN_KEY) as http:
        savings = http.get("/api/savings").json()
    blobs = blob_files(tmp_path)
    config = tmp_path / "config.yaml"

    clock.moment = T0 + 35 * DAY  # live was used 15 days ago, idle 35: only idle's lifetimes have passed
    dry = counts(gc(config, clock.moment, capsys, "--dry-run"))
    removed = counts(gc(config, clock.moment, capsys))

    assert removed == dry
    assert removed["model_runs"] == 1 and removed["context_assemblies"] == 1 and removed["conversations"] == 1
    assert removed["tool_artifacts"] == 2 and removed["blobs"] == 1  # its ledger's file is live's too
    assert len(blobs - blob_files(tmp_path)) == 1
    with gateway.client(key=ADMIN_KEY) as http:
        assert http.get("/api/savings").json() == savings
    with gateway.client() as http:
        assert http.get(f"/api/requests/{idle_record['id']}").status_code == 404
        assert http.get(f"/api/artifacts/{idle_record['captured_artifact_ids'][0]}").status_code == 404
        assert http.get(f"/api/artifacts/{memory['artifact_id']}").content == INVOICE.encode()

    send(gateway, live, label="live")  # the live conversation's next request: the same bytes go upstream
    assert forwarded(gateway) == before
    live += [{"role": "assistant", "content": "noted"}, {"role": "user", "content": "What is the exact total?"}]
    gateway.fake.reset()
    gateway.fake.script_message(rehydrate(memory["artifact_id"]))
    gateway.fake.script_message({"role": "assistant", "content": "48,213.77 EUR"})
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": live, "tools": TOOLS},
                             headers={"x-gateway-session": "live"})
    assert response.json()["choices"][0]["message"]["content"] == "48,213.77 EUR"
    assert gateway.fake.requests[1]["body"]["messages"][-1] == {"role": "tool", "tool_call_id": "gw_1",
                                                                "content": INVOICE}


def test_the_server_collects_on_its_schedule_one_replica_at_a_time(gateway: RunningGateway, clock: Clock) -> None:
    send(gateway, invoice_conversation(), label="old")
    services = gateway.app.state.services
    settings = services.settings.model_copy(update={"retention": services.settings.retention.model_copy(
        update={"gc_interval_seconds": 3600.0})})
    housekeeping = Housekeeping(services.store, settings.server, lambda: settings, clock)
    clock.moment += timedelta(minutes=30)
    assert housekeeping.collect_garbage_if_due() is None  # not due yet
    clock.moment = T0 + 31 * DAY
    report = housekeeping.collect_garbage_if_due()
    assert report is not None and report.counts["model_runs"] == 1 and report.counts["tool_artifacts"] == 2
    assert housekeeping.collect_garbage_if_due() is None  # the next one waits an interval again


def tenant_identifiers(gateway: RunningGateway, tenant: str) -> set[str]:
    """The tenant id and the keys of its rows (runs, conversations, nodes, artifacts, ...)."""
    found = {tenant}
    with gateway.store.engine.connect() as connection:
        for table in Base.metadata.sorted_tables:
            if "tenant" in table.c:
                # its keys: ids that hash the tenant in or are random (digests of content are shared)
                keys = [c for c in table.primary_key.columns if c.name != "digest"]
                for row in connection.execute(select(*keys).where(table.c.tenant == tenant)):
                    found.update(v for v in row if isinstance(v, str) and len(v) >= 16)
    return found


def rows_naming(gateway: RunningGateway, identifiers: set[str]) -> dict[str, int]:
    """Rows of every table with a text column holding one of `identifiers`."""
    found = {}
    with gateway.store.engine.connect() as connection:
        for table in Base.metadata.sorted_tables:
            columns = [c for c in table.c if isinstance(c.type, (String, Text))]
            hits = sum(1 for row in connection.execute(select(*columns))
                       if any(value in identifiers for value in row))
            if hits:
                found[table.name] = hits
    return found


def test_purging_a_tenant_leaves_only_its_audit_entry(gateway: RunningGateway, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    shared = invoice_conversation()  # both tenants capture the invoice: one blob file
    send(gateway, shared + [{"role": "assistant", "content": "noted"}, {"role": "user", "content": "next"}],
         label="a")
    only_acme = [m if m.get("content") != INVOICE else result("c1", OTHER_INVOICE) for m in shared]
    send(gateway, only_acme, label="b")
    theirs = send(gateway, shared, key=OTHER_TENANT_KEY, label="g")
    blobs = blob_files(tmp_path)
    assert len(blobs) == 3  # the invoice and the ledger (both tenants'), the other invoice (acme's alone)
    acme = tenant_identifiers(gateway, "acme")
    assert rows_naming(gateway, acme)["model_runs"] == 2

    with gateway.client() as http:  # a tenant key may not
        assert http.delete("/api/admin/tenants/acme").status_code == 403
    with gateway.client(key=ADMIN_KEY) as http:
        refused = http.delete("/api/admin/tenants/no%20such")
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "tenant_id"
        response = http.delete("/api/admin/tenants/acme")
    assert response.status_code == 200
    body = response.json()
    assert body["still_configured"] is True
    assert body["deleted"]["model_runs"] == 2 and body["deleted"]["blobs"] == 1
    assert body["deleted"]["conversation_nodes"] > 0 and body["deleted"]["conversations"] == 2

    assert rows_naming(gateway, acme) == {"tenant_purges": 1}  # nothing else of acme, in any table
    audit = gateway.store.purge_history("acme")
    assert [a["id"] for a in audit] == [body["audit_id"]] and audit[0]["actor"].startswith("admin key ")
    assert audit[0]["counts"] == body["deleted"]
    assert len(blob_files(tmp_path)) == 2  # the file only acme used went; the shared ones stay
    with gateway.client(key=OTHER_TENANT_KEY) as http:
        for artifact in theirs["path_artifact_ids"]:
            stored = http.get(f"/api/artifacts/{artifact}")
            assert stored.status_code == 200
        assert http.get(f"/api/artifacts/{theirs['path_artifact_ids'][0]}").content == INVOICE.encode()
        assert http.get(f"/api/requests/{theirs['id']}").json()["status"] == "ok"

    capsys.readouterr()
    config = tmp_path / "config.yaml"
    assert main(["tenant", "purge", "globex", "--config", str(config), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "purged tenant 'globex'" in out and "model_runs" in out
    assert not blob_files(tmp_path)
    leftovers: dict[str, Any] = rows_naming(gateway, {"acme", "globex"})
    assert leftovers == {"tenant_purges": 2}
    assert json.loads(json.dumps(gateway.store.purge_history("globex")))[0]["actor"].startswith("cli:")
