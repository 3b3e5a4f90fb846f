"""The evaluation against a model whose answers depend on what it can see (issue 31).

The reader fake model (gateway/fake_upstream/reader.py) reads the files its task names, then reports the
facts it needs once it sees them, and reads a file again when a memory stands where the fact was. Two
tenants, each with `holdout_share: 0.5` and every projected request shadowed:

- `lossy`: memories of ten characters at each end, no rehydration tool, on files whose fact sits in the
  middle: the projected arm reads again what it could not see. The report says `worse` on repeated calls,
  with an interval of the difference that excludes zero, and the shadows disagree (their disagreement's
  interval excludes zero too);
- `coder`: coding-agent on files whose fact is on the first line, which its memories keep: `no_difference`
  on every outcome signal, and every shadow agrees.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml
from sqlalchemy import text

from gateway.fake_upstream.reader import Reader
from policies.presets import _PRESETS
from testkit.fake_upstream import FakeUpstream
from testkit.gateway import ADMIN_KEY, RunningGateway, settings_for, start_gateway
from testkit.reader_client import reader_workload, run_conversation

CONVERSATIONS = 40  # per tenant: about 20 per arm, twice the report's minimum
EVALUATION = {"holdout_share": 0.5, "shadow_share": 1.0, "shadow_budget_usd_per_day": 100.0}
LOSSY = {"name": "lossy", "version": 1,
         "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 0, "clear_at_least_tokens": 0, "min_tokens": 0,
                        "head_chars": 10, "tail_chars": 10, "salient_chars": 0},
         "rehydration": {"max_rounds": 0}, "evaluation": EVALUATION}
SIGNALS = ("repeated_calls_per_request", "rehydrations_per_request", "tool_errors_per_call",
           "final_answer_share")


@pytest.fixture
def gateway(sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    coder = {**json.loads(json.dumps(_PRESETS["coding-agent"])), "evaluation": EVALUATION}
    (tmp_path / "lossy.yaml").write_text(yaml.safe_dump(LOSSY))
    (tmp_path / "coder.yaml").write_text(yaml.safe_dump(coder))
    tenants = [{"id": "lossy", "api_keys": ["sk-lossy"], "policy": "lossy.yaml"},
               {"id": "coder", "api_keys": ["sk-coder"], "policy": "coder.yaml"}]
    with FakeUpstream() as fake:
        Reader().drive(fake.state)
        running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, tenants=tenants), fake)
        try:
            yield running
        finally:
            server.stop()


def drive(gateway: RunningGateway, key: str, where: str) -> None:
    for n in range(CONVERSATIONS):
        workload = reader_workload(files=2, where=where)
        workload = replace(workload, task=f"{workload.task}\nTicket {n} of the {where} batch.")
        conversation = run_conversation(gateway.api_base, workload, key=key)
        assert conversation.answer == workload.answer  # both arms finish, right


def shadows_settled(gateway: RunningGateway, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    query = text("SELECT COUNT(*) FROM model_runs WHERE evaluation_arm = 'projected' AND shadow_status IS NULL")
    while time.monotonic() < deadline:
        with gateway.store.engine.connect() as connection:
            if connection.scalar(query) == 0:
                return
        time.sleep(0.2)
    raise AssertionError("shadows still pending")


def report(gateway: RunningGateway, key: str) -> dict[str, Any]:
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        return client.get("/api/evaluation").json()


def test_a_lossy_policy_is_worse_and_coding_agent_keeping_the_facts_makes_no_difference(
        gateway: RunningGateway) -> None:
    drive(gateway, "sk-lossy", "middle")
    drive(gateway, "sk-coder", "first")
    shadows_settled(gateway)

    lossy = report(gateway, "sk-lossy")
    assert lossy["enough_data"] is True
    assert all(0.3 <= arm["share"] <= 0.7 for arm in lossy["arms"].values())
    signals = {s["name"]: s for s in lossy["signals"]}
    repeated = signals["repeated_calls_per_request"]
    assert repeated["verdict"] == "worse"
    assert repeated["difference"]["interval"][0] > 0
    assert repeated["arms"]["holdout"]["count"] == 0 and repeated["arms"]["projected"]["count"] > 0
    assert signals["rounds_per_conversation"]["verdict"] == "worse"  # the extra read is an extra round
    shadow = lossy["shadow"]
    assert shadow["verdict"] == "worse" and shadow["agreement"] < 1
    assert shadow["disagreement_interval"][0] > 0 and shadow["interval"][1] < 1

    coder = report(gateway, "sk-coder")
    assert coder["enough_data"] is True
    signals = {s["name"]: s for s in coder["signals"]}
    for name in SIGNALS:
        assert signals[name]["verdict"] == "no_difference", (name, signals[name])
    assert signals["rounds_per_conversation"]["verdict"] == "no_difference"
    assert signals["tokens_forwarded_per_conversation"]["verdict"] == "better"
    assert coder["shadow"]["agreement"] == 1.0 and coder["shadow"]["verdict"] == "no_difference"
    assert coder["shadow"]["compared"] >= 2 * 10

    # The same in the metrics: answered runs per arm, repeated calls, shadows by how they ended.
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=30).text
    runs = {arm: lossy["arms"][arm]["requests"] for arm in ("projected", "holdout")}
    for arm, count in runs.items():
        assert f'gateway_evaluation_runs_total{{arm="{arm}",tenant="lossy"}} {float(count)}' in metrics
    assert (f'gateway_repeated_calls_total{{arm="projected",tenant="lossy"}} '
            f'{float(repeated["arms"]["projected"]["count"])}') in metrics
    assert 'gateway_shadows_total{agreed="false",status="ok",tenant="lossy"} ' in metrics
    assert f'gateway_shadows_total{{agreed="true",status="ok",tenant="coder"}} {float(coder["shadow"]["compared"])}' \
        in metrics

    # An admin may read each tenant's, and the two stay apart.
    assert report(gateway, ADMIN_KEY)["arms"]["projected"]["conversations"] == (
        lossy["arms"]["projected"]["conversations"] + coder["arms"]["projected"]["conversations"])
