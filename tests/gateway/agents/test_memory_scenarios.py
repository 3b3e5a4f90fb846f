"""Memories that keep what decides (issue 12), driven through the running gateway.

Each scenario is a long conversation sent the way agents send it (the whole
transcript every turn) under a built-in preset plus the tool rules a tenant
would add. In each, the deciding text must be in the last request the model
is given, and that request must be at least 85% smaller in tokens than the
transcript the client sent.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

from policies.presets import _PRESETS
from testkit.gateway import TENANT_KEY, RunningGateway, dashboard_sign_in, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream
from tests.gateway.agents.test_scenarios import call, result

ROUNDS = 26


def business_policy() -> dict[str, Any]:
    raw = json.loads(json.dumps(_PRESETS["default"]))  # the shipped preset, plus a tenant's tool rules
    raw["name"] = "business-agent"
    raw["tools"] = [{"match": ["get_document"], "supersede_on": ["arguments.doc_id"], "revision_on": "result.revision"}]
    return raw


@pytest.fixture
def gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    (tmp_path / "business.yaml").write_text(yaml.safe_dump(business_policy()))
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "business.yaml"}]
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, tenants=tenants), fake)
    yield running
    server.stop()


def prose(topic: str, count: int, start: int = 1) -> list[str]:
    return [f"{topic} {i}: the usual terms apply to deliveries, invoices and the handling of parcels in transit."
            for i in range(start, start + count)]


def tickets(n: int) -> str:
    """A large, varied queue listing: nothing in it decides anything."""
    return "\n".join(f"ticket {n * 100 + i}: opened by a customer in region {i % 7}; category shipping; "
                     f"awaiting triage by the queue owner" for i in range(60))


class Agent:
    def __init__(self, gateway: RunningGateway, system: str) -> None:
        self.gateway = gateway
        self.messages: list[dict] = [{"role": "system", "content": system}]
        self.last: httpx.Response | None = None

    def send(self, *messages: dict) -> str:
        self.messages.extend(messages)
        self.gateway.fake.script_message({"role": "assistant", "content": "noted"})
        with self.gateway.client() as http:
            self.last = http.post("/v1/chat/completions", json={"model": "fake", "messages": self.messages},
                                  headers={"x-gateway-session": "memory-scenario"})
        assert self.last.status_code == 200, self.last.text
        return json.dumps(self.gateway.fake.last_body()["messages"], ensure_ascii=False)

    def work(self, rounds: int, output=tickets) -> str:
        seen = ""
        for n in range(rounds):
            seen = self.send(call(f"w{n}", "list_tickets", page=n), result(f"w{n}", output(n)))
        return seen

    def reduction(self) -> float:
        assert self.last is not None
        sent = int(self.last.headers["x-gateway-tokens-original"])
        return 1 - int(self.last.headers["x-gateway-tokens-forwarded"]) / sent

    def assembly(self) -> dict:
        assert self.last is not None
        with self.gateway.client() as http:
            return http.get(f"/api/requests/{self.last.headers['x-gateway-request-id']}").json()["assembly"]


def test_an_early_exception_survives_a_flood_of_duplicate_outputs(gateway: RunningGateway) -> None:
    exception = ("Exception: orders of PLATINUM customers may be refunded after 90 days only with approval "
                 "from finance.")
    policy = prose("Clause", 70) + [exception] + prose("Clause", 70, start=71)
    agent = Agent(gateway, "You are a refunds agent.")
    agent.send({"role": "user", "content": "Customer C-88 (PLATINUM) wants a refund on order 4471, 120 days old."},
               call("p", "get_document", doc_id="refund-policy"),
               result("p", json.dumps({"revision": 7, "text": "\n".join(policy)}, indent=0).replace("\\n", "\n")))
    status = "\n".join(f"order 4471 line {i}: shipped, delivered, no dispute on file" for i in range(50))
    seen = agent.work(ROUNDS, output=lambda n: f"checked at 2026-11-30T06:{n:02d}:00Z\n{status}")
    assert "PLATINUM customers may be refunded after 90 days only with approval" in seen
    assert agent.reduction() >= 0.85, agent.reduction()
    decisions = agent.assembly()["decisions"]
    duplicates = [d for d in decisions if d["reason"].startswith("duplicate_of:")]
    assert len(duplicates) >= ROUNDS - 3  # the flood became references to its first output
    policy_decision = decisions[3]
    assert policy_decision["action"] == "compacted" and "condition" in policy_decision["kept"]
    with httpx.Client(base_url=gateway.url, timeout=30) as client:  # the inspector shows it
        assert dashboard_sign_in(client, TENANT_KEY).status_code in (200, 303)
        page = client.get(f"/dashboard/requests/{agent.last.headers['x-gateway-request-id']}").text
    assert "kept lines: " in page and "condition" in page


def test_the_later_revision_decides_and_the_earlier_is_marked_superseded(gateway: RunningGateway) -> None:
    def revision(number: int, days: int) -> str:
        lines = prose("Term", 60) + [f"Annual plans may be cancelled only if notice is given {days} days "
                                     f"before renewal."] + prose("Term", 60, start=61)
        return json.dumps({"revision": number, "doc_id": "terms", "text": lines})

    agent = Agent(gateway, "You are a subscriptions agent.")
    agent.send({"role": "user", "content": "Can customer C-12 cancel the annual plan now?"},
               call("r1", "get_document", doc_id="terms"), result("r1", revision(3, 60)))
    agent.work(3)
    agent.send(call("r2", "get_document", doc_id="terms"), result("r2", revision(4, 30)))
    seen = agent.work(ROUNDS - 3)
    assert "notice is given 30 days before renewal" in seen
    assert "notice is given 60 days" not in seen
    assert "(revision 3): replaced by revision 4" in seen
    assert agent.reduction() >= 0.85, agent.reduction()


def test_a_negation_in_the_middle_of_a_long_note_reaches_the_model(gateway: RunningGateway) -> None:
    note = prose("Note", 80) + ["After the call the decision is: do NOT cancel the subscription, only pause it "
                                "until March."] + prose("Note", 80, start=81)
    agent = Agent(gateway, "You are a support agent.")
    agent.send({"role": "user", "content": "What should we do with account A-301?"},
               call("n", "read_support_note", account="A-301"), result("n", "\n".join(note)))
    seen = agent.work(ROUNDS)
    assert "do NOT cancel the subscription, only pause it" in seen
    assert agent.reduction() >= 0.85, agent.reduction()


def test_an_unretried_error_survives_many_rounds_of_compaction(gateway: RunningGateway) -> None:
    failure = "Error: migration 0042 failed: column invoices.total is referenced by view monthly_totals"
    agent = Agent(gateway, "You are a database operations agent.")
    agent.send({"role": "user", "content": "Run the pending migrations, then clean up the ticket queue."},
               call("m", "run_migrations", target="latest"), result("m", failure))
    seen = agent.work(ROUNDS)
    forwarded = json.loads(seen)
    assert forwarded[3]["content"] == failure  # whole, as sent: recovery state until retried
    assert agent.assembly()["decisions"][3]["reason"] == "failed_not_retried"
    assert agent.reduction() >= 0.85, agent.reduction()
