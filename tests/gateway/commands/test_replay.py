"""`gateway replay` offline, and the same figures through the running gateway.

The coding-agent preset's figures on the shared traces are the product's
contract (issue 3): no protocol violation, system/user/latest round verbatim,
peak context at most 0.6x the replay on the median trace with 20+ tool calls,
cost under the cache price model at most 1.05x the cached replay on every
trace and at most 0.85x on that median trace.
"""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.commands.replay import CachePrices, replay_trace, totals, trace_turns, turn_figures, wire_message
from policies.presets import preset
from testkit.gateway import RunningGateway, load_trace, settings_for, start_gateway, trace_files
from testkit.fake_upstream import FakeUpstream

TRACES = trace_files()
ARTIFACT_REF = re.compile(r"artifact:((?:art|args)_[0-9a-f]+)")


@pytest.fixture(scope="module")
def offline_rows() -> list[dict]:
    policy = preset("coding-agent")
    return [replay_trace(policy, load_trace(p), p.name, tenant="acme").summary(CachePrices()) for p in TRACES]


def test_coding_agent_meets_the_figures(offline_rows: list[dict]) -> None:
    total = totals(offline_rows)
    assert total["protocol_violations"] == 0
    assert total["latest_round_lost"] == 0 and total["user_system_lost"] == 0
    for row in offline_rows:
        assert row["cost_vs_cached_replay"] <= 1.0, row  # never dearer than replaying everything
    big = [r for r in offline_rows if r["tool_calls"] >= 20]
    assert len(big) >= 5
    assert statistics.median(r["peak_ratio"] for r in big) <= 0.6
    assert statistics.median(r["cost_vs_cached_replay"] for r in big) <= 0.85
    assert total["reduction"] > 0.4


@pytest.mark.parametrize("name", ["default", "passthrough"])
def test_other_presets_keep_the_protocol(name: str) -> None:
    policy = preset(name)
    rows = [replay_trace(policy, load_trace(p), p.name).summary(CachePrices()) for p in TRACES]
    total = totals(rows)
    assert total["protocol_violations"] == total["latest_round_lost"] == total["user_system_lost"] == 0
    if name == "passthrough":
        assert total["forwarded_tokens"] == total["sent_tokens"]
    else:
        assert max(r["cost_vs_cached_replay"] for r in rows) <= 1.05


def test_replay_command_prints_the_table() -> None:
    traces = [str(p) for p in TRACES[:3]]
    result = subprocess.run([sys.executable, "-m", "gateway", "replay", "--policy", "coding-agent", *traces],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "policy coding-agent v1-" in result.stdout and "TOTAL" in result.stdout
    for path in TRACES[:3]:
        assert path.name[:40] in result.stdout
    as_json = subprocess.run([sys.executable, "-m", "gateway", "replay", "--json", *traces],
                             capture_output=True, text=True, timeout=120)
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert rows[-1]["TOTAL"] is True and len(rows) == 4


@pytest.fixture
def coding_gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path):
    tenants = [{"id": "acme", "api_keys": ["sk-acme-1"], "policy": "coding-agent"}]
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, tenants=tenants), fake)
    yield running
    server.stop()


ONLINE = TRACES


@pytest.mark.parametrize("trace_path", ONLINE, ids=[p.stem for p in ONLINE])
def test_online_replay_forwards_exactly_the_offline_projection(coding_gateway: RunningGateway, trace_path: Path) -> None:
    gateway = coding_gateway
    trace = load_trace(trace_path)
    offline: list[list[dict]] = []
    replay_trace(preset("coding-agent"), trace, trace_path.name, tenant="acme",
                 on_projection=lambda _request, projection: offline.append(projection.messages))
    messages, turns = trace_turns(trace)
    tools = sorted({c["function"]["name"] for m in messages for c in m.get("tool_calls") or []})
    tool_schemas = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in tools]
    previous, online_figures = None, []
    with gateway.client() as http:
        for turn, i in enumerate(turns):
            gateway.fake.script_message(messages[i])
            response = http.post("/v1/chat/completions",
                                 json={"model": "fake", "messages": messages[:i], "tools": tool_schemas})
            assert response.status_code == 200, response.text
            forwarded = [wire_message(m) for m in gateway.fake.last_body()["messages"]]
            assert forwarded == [wire_message(m) for m in offline[turn]]
            figures = turn_figures(messages[:i], forwarded, previous)
            assert int(response.headers["x-gateway-tokens-original"]) == figures.sent
            assert int(response.headers["x-gateway-tokens-forwarded"]) == figures.forwarded
            online_figures.append(figures)
            previous = forwarded
        # every compacted message names an artifact whose raw bytes the API returns exactly
        originals = {}
        record = http.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()
        assert record["assembly"]["policy"]["name"] == "coding-agent"
        refs = set(ARTIFACT_REF.findall(json.dumps(forwarded)))
        for m in messages:
            if m["role"] == "tool":
                originals.setdefault(m["content"].encode(), True)
            for c in m.get("tool_calls") or []:
                originals.setdefault(c["function"]["arguments"].encode(), True)
        for ref in refs:
            raw = http.get(f"/api/artifacts/{ref}")
            assert raw.status_code == 200 and raw.content in originals
    assert sum(f.forwarded for f in online_figures) <= sum(f.sent for f in online_figures)
    assert all(not f.problems and f.latest_round_kept and f.user_system_kept for f in online_figures)


def test_same_request_twice_forwards_identical_bytes(coding_gateway: RunningGateway) -> None:
    trace = load_trace(next(p for p in TRACES if "ponyc-4588" in p.name))
    messages, turns = trace_turns(trace)
    body = {"model": "fake", "messages": messages[: turns[30]]}
    bodies = []
    with coding_gateway.client() as http:
        for _ in range(2):
            assert http.post("/v1/chat/completions", json=body).status_code == 200
            bodies.append(json.dumps(coding_gateway.fake.last_body()["messages"], sort_keys=True))
    assert bodies[0] == bodies[1]
    assert "[compacted artifact:" in bodies[0]


@pytest.mark.parametrize("content, problem", [
    (None, "no such file"),
    ('{"model": "x"}', "holds no `messages` list"),
    ("not json at all", "is neither JSON nor JSONL"),
    ('{"messages": [{"content": "no role"}]}', "messages[0] is not a message with a `role`"),
])
def test_replay_says_what_is_wrong_with_a_trace(tmp_path: Path, content: str | None, problem: str) -> None:
    trace = tmp_path / "trace.jsonl"
    if content is not None:
        trace.write_text(content)
    result = subprocess.run([sys.executable, "-m", "gateway", "replay", str(trace)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith(f"gateway: trace {trace}: {problem}")
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


def test_replay_names_the_presets_for_an_unknown_policy(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "gateway", "replay", "--policy", "coding_agent",
                             str(TRACES[0])], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "coding-agent" in result.stderr and "default" in result.stderr and "passthrough" in result.stderr


def test_replay_explains_its_columns_and_prices_in_dollars() -> None:
    result = subprocess.run([sys.executable, "-m", "gateway", "replay", "--usd-per-mtok", "2", str(TRACES[0])],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for column in ("cut", "peak x", "reuse", "cost x", "viol"):
        assert re.search(rf"^  {re.escape(column)}\s{{2,}}\S", result.stdout, re.MULTILINE), column
    row = json.loads(subprocess.run([sys.executable, "-m", "gateway", "replay", "--json", "--usd-per-mtok", "2",
                                     str(TRACES[0])], capture_output=True, text=True, timeout=120).stdout.splitlines()[0])
    match = re.search(r"input cost: \$([0-9.]+) projected against \$([0-9.]+) replayed", result.stdout)
    assert match and float(match.group(1)) == pytest.approx(row["input_usd"], abs=1e-4)
    assert float(match.group(2)) == pytest.approx(row["replay_input_usd"], abs=1e-4)
    assert row["input_usd"] == pytest.approx(row["replay_input_usd"] * row["cost_vs_cached_replay"], rel=1e-3)
