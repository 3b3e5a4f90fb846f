"""`gateway demo`: the bundled agent session through a running gateway shows real savings at once."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.commands.demo import TRACE, bundled_trace
from testkit.gateway import REPO, TENANT_KEY, RunningGateway


def test_the_bundled_trace_is_the_test_suites_copy() -> None:
    """The packaged file is byte for byte the trace tests/data/traces documents (source and licence)."""
    packaged = (REPO / "gateway" / "demo" / TRACE).read_bytes()
    assert packaged == (REPO / "tests" / "data" / "traces" / TRACE).read_bytes()
    trace = bundled_trace()
    assert trace["license"] == "MIT" and trace["source"].startswith("All-Hands-AI/OpenHands/")
    assert sum(len(m.get("tool_calls") or []) for m in trace["messages"]) == 23


def test_the_demo_sends_the_session_and_reports_its_savings(gateway: RunningGateway,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--url", gateway.url, "--key", TENANT_KEY, "--model", "demo"]) == 0
    out = capsys.readouterr().out
    session = next(line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith("session "))
    with gateway.client() as http:
        ledger = http.get("/api/savings", params={"session": session}).json()["totals"]
    assert ledger["requests"] == 23
    assert ledger["tokens_forwarded"] < 0.5 * ledger["tokens_sent"]  # the default policy compacts old results
    # the offline model's runs count the tokens forwarded, not LiteLLM's mock count (10 a request)
    assert ledger["prompt_tokens"] == ledger["tokens_forwarded"]
    assert f"{ledger['tokens_sent']:,} prompt tokens sent" in out and f"{ledger['tokens_forwarded']:,} forwarded" in out
    assert f"open {gateway.url}/dashboard" in out


def test_a_demo_against_nothing_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--url", "http://127.0.0.1:9", "--key", TENANT_KEY]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gateway demo: cannot reach the gateway at http://127.0.0.1:9") and len(err.splitlines()) == 1


def test_a_refused_key_is_said(gateway: RunningGateway, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--url", gateway.url, "--key", "sk-nobody"]) == 1
    assert "request 1 answered 401" in capsys.readouterr().err


def test_the_package_data_names_the_demo(tmp_path: Path) -> None:
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["gateway"]
    assert "demo/*.jsonl" in data and json.loads((REPO / "gateway" / "demo" / TRACE).read_text().splitlines()[0])
