"""The dashboard in a real (headless) browser: sign-in, totals, inspector, artifacts, tenant isolation.

One gateway serves the whole module. All the shared agent traces are replayed
through it turn by turn as tenant acme (coding-agent policy, so later turns
are compacted) and a short conversation with one tool result as globex
(default policy). Chromium, driven by Playwright's sync API, then signs in
through the login form and checks that

- the key travels only in the form body (never in a URL) and the session
  cookie is HttpOnly;
- the overview's totals cards show exactly what `GET /api/savings` answers;
- the inspector of a compacted request shows kept and compacted messages and
  the omission reasons, and its artifact links return the trace's bytes;
- another tenant's request and artifact are 404 for a tenant, while an admin
  sees every tenant and can filter the overview down to one.

Screenshots of the overview and the inspector land in
`test-output/screenshots/` (git-ignored) for a human to look at.

Uses Debian's chromium at /usr/bin/chromium: without it the tests skip,
unless GATEWAY_TEST_REQUIRE_SERVICES=1, which makes them fail.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from gateway.commands.replay import trace_turns
from tests.conftest import (
    ADMIN_KEY,
    OTHER_TENANT_KEY,
    REPO,
    REQUIRE_SERVICES,
    TENANT_KEY,
    RunningGateway,
    load_trace,
    settings_for,
    start_gateway,
    trace_files,
)
from testkit.fake_upstream import FakeUpstream
from policies.transcript import short_ref

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOTS = REPO / "test-output" / "screenshots"

# Every shared trace, replayed turn by turn as tenant acme (the coding-agent policy compacts them).
TRACES = tuple(p.stem for p in trace_files())
PRICES = {"input_cost_per_token": 3e-6, "output_cost_per_token": 1.5e-5, "cache_read_input_token_cost": 3e-7}
METRICS = ("requests", "tokens_sent", "tokens_forwarded", "cached_tokens", "cost_usd", "saved_usd")
USD_METRICS = {"cost_usd", "saved_usd"}

GLOBEX_RESULT = "\n".join(f"shipment {i}: delivered to warehouse {i % 7}, signed by clerk {i % 13}"
                          for i in range(60))
GLOBEX_CONVERSATION = [
    {"role": "system", "content": "You are a logistics agent."},
    {"role": "user", "content": "List this week's shipments."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "g1", "type": "function", "function": {"name": "list_shipments", "arguments": '{"week": 47}'}}]},
    {"role": "tool", "tool_call_id": "g1", "content": GLOBEX_RESULT},
]


@dataclass
class Seeded:
    """The running gateway and what was sent through it."""

    gateway: RunningGateway
    acme_requests: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # request id -> messages sent
    globex_request_id: str = ""
    globex_artifact_id: str = ""

    @property
    def url(self) -> str:
        return self.gateway.url

    def savings(self, key: str, **params: str) -> dict[str, Any]:
        with self.gateway.client(key=key) as http:
            response = http.get("/api/savings", params=params)
        assert response.status_code == 200, response.text
        return response.json()


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} not found (install Debian's chromium package)"
        if REQUIRE_SERVICES:
            pytest.fail(f"{message}; GATEWAY_TEST_REQUIRE_SERVICES=1 makes it mandatory")
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _trace_path(name: str) -> Path:
    found = [p for p in trace_files() if p.stem == name]
    assert found, f"shared trace {name}.jsonl is missing from the traces directory"
    return found[0]


def _replay_as_acme(seeded: Seeded, name: str) -> None:
    """Each assistant turn i of the trace: the fake answers messages[i] to a request of messages[:i]."""
    gateway = seeded.gateway
    messages, turns = trace_turns(load_trace(_trace_path(name)))
    names = sorted({c["function"]["name"] for m in messages for c in m.get("tool_calls") or []})
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]
    with gateway.client(key=TENANT_KEY) as http:
        for i in turns:
            gateway.fake.script_message(messages[i])
            response = http.post("/v1/chat/completions", headers={"x-gateway-session": name},
                                 json={"model": "fake", "messages": messages[:i], "tools": tools})
            assert response.status_code == 200, response.text
            seeded.acme_requests[response.headers["x-gateway-request-id"]] = messages[:i]


def _send_as_globex(seeded: Seeded) -> None:
    gateway = seeded.gateway
    gateway.fake.script_message({"role": "assistant", "content": "Sixty shipments, all delivered."})
    tools = [{"type": "function", "function": {"name": "list_shipments", "parameters": {"type": "object"}}}]
    with gateway.client(key=OTHER_TENANT_KEY) as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": GLOBEX_CONVERSATION,
                                                           "tools": tools})
        assert response.status_code == 200, response.text
        seeded.globex_request_id = response.headers["x-gateway-request-id"]
        record = http.get(f"/api/requests/{seeded.globex_request_id}").json()
    assert len(record["captured_artifact_ids"]) == 1
    seeded.globex_artifact_id = record["captured_artifact_ids"][0]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    tmp = tmp_path_factory.mktemp("dashboard")
    with FakeUpstream() as fake:
        settings = settings_for(
            fake.api_base, f"sqlite:///{tmp / 'gateway.db'}", tmp,
            models=[{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": fake.api_base,
                                                        "api_key": "sk-upstream", **PRICES}}],
            tenants=[{"id": "acme", "api_keys": [TENANT_KEY], "policy": "coding-agent"},
                     {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "policy": "default"}],
            admin_keys=[ADMIN_KEY],
        )
        gateway, server = start_gateway(settings, fake)
        try:
            seeded = Seeded(gateway)
            for name in TRACES:
                _replay_as_acme(seeded, name)
            _send_as_globex(seeded)
            yield seeded
        finally:
            server.stop()


# --- helpers ---------------------------------------------------------------------------------------


def sign_in(browser: Any, url: str, key: str) -> tuple[Any, Any]:
    """A fresh browser context signed in through the login form; returns (context, page on the overview)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{url}/dashboard/login")
    page.fill("input[name=api_key]", key)
    with page.expect_navigation():
        page.click("#sign-in")
    assert page.url == f"{url}/dashboard", page.url
    return context, page


@pytest.fixture
def acme_page(browser: Any, seeded: Seeded) -> Iterator[Any]:
    context, page = sign_in(browser, seeded.url, TENANT_KEY)
    yield page
    context.close()


def card_values(page: Any) -> dict[str, str]:
    """The totals cards as rendered: data-metric -> data-value."""
    return page.eval_on_selector_all(
        "[data-metric]", "els => Object.fromEntries(els.map(e => [e.dataset.metric, e.dataset.value]))")


def assert_cards_match(page: Any, totals: dict[str, Any]) -> None:
    cards = card_values(page)
    assert set(METRICS) <= set(cards), cards
    for metric in METRICS:
        if metric in USD_METRICS:
            assert float(cards[metric]) == pytest.approx(totals[metric], abs=1e-9), metric
        else:
            assert int(cards[metric]) == totals[metric], metric


def column(page: Any, table: str, index: int) -> list[str]:
    """The text of cell `index` in every body row of `table`."""
    return page.eval_on_selector_all(
        f"{table} tbody tr", f"rows => rows.map(r => r.cells[{index}] ? r.cells[{index}].innerText.trim() : '')")


def session_labels(page: Any) -> list[str]:
    """The full session labels of the #sessions table (the cell may shorten them)."""
    return page.eval_on_selector_all("#sessions tbody td[title]", "cells => cells.map(c => c.title)")


def number(text: str) -> int:
    return int(text.replace(",", ""))


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0
    return path


# --- tests -----------------------------------------------------------------------------------------


def test_sign_in_keeps_the_key_out_of_urls_and_scripts(browser: Any, seeded: Seeded) -> None:
    context = browser.new_context()
    page = context.new_page()
    requests: list[Any] = []
    page.on("request", lambda request: requests.append(request))

    page.goto(f"{seeded.url}/dashboard")
    assert page.url == f"{seeded.url}/dashboard/login"  # not signed in: redirected to the form

    page.fill("input[name=api_key]", "sk-not-a-key")
    with page.expect_navigation() as wrong:
        page.click("#sign-in")
    assert wrong.value.status == 401
    assert "not known" in page.inner_text("#login-error")
    assert not [c for c in context.cookies() if c["name"] == "gw_session"]

    page.fill("input[name=api_key]", TENANT_KEY)
    with page.expect_navigation():
        page.click("#sign-in")
    assert page.url == f"{seeded.url}/dashboard"
    assert page.inner_text("h1").startswith("Savings")
    assert "tenant acme" in page.inner_text("header")

    # the keys went in POST bodies only: no URL the browser asked for, or ended on, holds one
    urls = [r.url for r in requests]
    assert not [u for u in urls if TENANT_KEY in u or "sk-not-a-key" in u], urls
    posts = [r for r in requests if r.method == "POST"]
    assert [r.url for r in posts] == [f"{seeded.url}/dashboard/login"] * 2
    assert f"api_key={TENANT_KEY}" in posts[1].post_data
    assert TENANT_KEY not in page.url
    (cookie,) = [c for c in context.cookies() if c["name"] == "gw_session"]
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert TENANT_KEY not in cookie["value"]
    assert "gw_session" not in page.evaluate("document.cookie")  # no script can read it
    context.close()


def test_overview_totals_equal_the_savings_api(acme_page: Any, seeded: Seeded) -> None:
    page = acme_page
    totals = seeded.savings(TENANT_KEY)["totals"]
    assert totals["requests"] == len(seeded.acme_requests)
    assert totals["tokens_forwarded"] < totals["tokens_sent"] and totals["cost_usd"] > 0
    assert_cards_match(page, totals)
    assert set(session_labels(page)) == set(TRACES)  # a tenant sees its own sessions only
    screenshot(page, "overview.png")


def _open_compacted_request(page: Any, seeded: Seeded) -> str:
    """Click the first request in #requests whose sent tokens exceed its forwarded tokens; its id."""
    sent, forwarded = column(page, "#requests", 4), column(page, "#requests", 5)  # tenant view: no tenant column
    row = next(i for i, (s, f) in enumerate(zip(sent, forwarded)) if number(s) > number(f))
    with page.expect_navigation():
        page.locator("#requests tbody tr").nth(row).locator("a").first.click()
    request_id = page.url.rsplit("/", 1)[1]
    assert request_id in seeded.acme_requests
    return request_id


def test_inspector_shows_kept_and_compacted_messages(acme_page: Any, seeded: Seeded) -> None:
    page = acme_page
    request_id = _open_compacted_request(page, seeded)
    with seeded.gateway.client(key=TENANT_KEY) as http:
        record = http.get(f"/api/requests/{request_id}").json()
    assembly = record["assembly"]
    assert assembly["tokens"]["original"] > assembly["tokens"]["forwarded"]

    assert page.locator("#inspector .decision").count() == len(seeded.acme_requests[request_id])
    assert page.locator("[data-action=verbatim]").count() > 0
    assert page.locator("[data-action=compacted]").count() > 0
    assert page.locator("#omissions").is_visible()
    # the "why" panel: decisions and omissions counted by reason, as the assembly recorded them
    # (these traces compact but omit nothing, so the panel says "nothing" where the API says {})
    counts = Counter(d["action"] for d in assembly["decisions"])
    assert counts["compacted"] > 0 and counts["verbatim"] > 0
    shown = page.inner_text("#decision-counts")
    for action, n in counts.items():
        assert f"{action.replace('_', ' ')} {n}" in shown, (action, n, shown)
    assert page.locator("#omissions [data-omission]").count() == len(assembly["omissions"])
    for reason, n in assembly["omissions"].items():
        assert page.inner_text(f"[data-omission='{reason}']").endswith(f": {n}")
    if not assembly["omissions"]:
        assert "Omitted or withheld\nnothing" in page.inner_text("#omissions")
    # a compacted message's forwarded text names the artifact its raw-artifact link opens
    compacted = page.locator(".decision[data-action=compacted]").first
    link = compacted.locator("xpath=preceding-sibling::div[1]").locator("a.artifact-link")
    assert f"artifact:{short_ref(link.get_attribute('data-artifact'))}" in compacted.inner_text()
    screenshot(page, "inspector.png")


def test_artifact_link_returns_the_traces_bytes(acme_page: Any, seeded: Seeded) -> None:
    page = acme_page
    request_id = _open_compacted_request(page, seeded)
    messages = seeded.acme_requests[request_id]
    compacted = page.locator(".decision[data-action=compacted]").first
    index = int(compacted.locator("xpath=preceding-sibling::div[2]").inner_text())
    link = compacted.locator("xpath=preceding-sibling::div[1]").locator("a.artifact-link")
    artifact_id = link.get_attribute("data-artifact")
    original = messages[index]
    assert original["role"] == "tool" and isinstance(original["content"], str)

    with page.expect_navigation() as followed:
        link.click()  # cookie-authenticated: the browser sends no bearer key
    response = followed.value
    assert response.status == 200
    assert page.url == f"{seeded.url}/api/artifacts/{artifact_id}"
    assert response.headers["x-artifact-id"] == artifact_id
    assert response.body() == original["content"].encode("utf-8")


def test_a_tenant_cannot_see_another_tenants_records(acme_page: Any, seeded: Seeded) -> None:
    page = acme_page
    response = page.goto(f"{seeded.url}/dashboard/requests/{seeded.globex_request_id}")
    assert response.status == 404
    assert page.locator("#not-found").is_visible()
    assert seeded.globex_request_id not in page.content()

    response = page.goto(f"{seeded.url}/api/artifacts/{seeded.globex_artifact_id}")
    assert response.status == 404
    assert GLOBEX_RESULT[:40] not in response.text()

    # the same ids open for their own tenant (so the 404s above are isolation, not bad ids)
    with seeded.gateway.client(key=OTHER_TENANT_KEY) as http:
        assert http.get(f"/api/artifacts/{seeded.globex_artifact_id}").content == GLOBEX_RESULT.encode()


def test_admin_sees_every_tenant_and_filters_by_tenant(browser: Any, seeded: Seeded) -> None:
    context, page = sign_in(browser, seeded.url, ADMIN_KEY)
    try:
        assert "admin" in page.inner_text("header")
        everything = seeded.savings(ADMIN_KEY)
        assert {t["tenant"] for t in everything["by_tenant"]} == {"acme", "globex"}
        assert everything["totals"]["requests"] == len(seeded.acme_requests) + 1
        assert_cards_match(page, everything["totals"])
        assert set(column(page, "#sessions", 0)) == {"acme", "globex"}  # admin view: tenant column first

        page.select_option("#tenant-filter", "globex")
        with page.expect_navigation():
            page.click("form.filters button[type=submit]")
        assert "tenant=globex" in page.url
        globex = seeded.savings(ADMIN_KEY, tenant="globex")["totals"]
        assert globex["requests"] == 1
        assert_cards_match(page, globex)
        assert page.input_value("#tenant-filter") == "globex"
        assert set(column(page, "#sessions", 0)) == {"globex"}
        assert set(column(page, "#requests", 1)) == {"globex"}
        assert page.locator(f"#requests a[href='/dashboard/requests/{seeded.globex_request_id}']").count() == 1
    finally:
        context.close()
