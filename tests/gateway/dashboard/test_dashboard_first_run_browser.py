"""The first-run dashboard in a real browser: what a new user sees after `make run` and `make demo`.

One gateway on config.example.yaml as shipped (its storage in a temporary folder, its `fake` model on a
fake upstream of this test's own port rather than 18080). Through it: the bundled demo session
(`gateway demo`, labelled), two unlabelled conversations of two turns each from the openai SDK, and a
request to `fake` that fails on every try. Chromium then shows:

- money figures with a price: the demo model carries a demo price, so cost and savings are not $0;
- the failed run's error and each of its attempts, reached from the recent requests;
- an unlabelled conversation named by its first user message (as text, escaped), its id in the title,
  the same name in the sessions table, the recent requests and the request's page as in the API.

Uses Debian's chromium like tests/gateway/dashboard/test_dashboard_browser.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import openai
import pytest
import yaml

from gateway.commands.demo import run_demo
from gateway.config import load_settings
from testkit.gateway import REPO, TENANT_KEY, start_gateway
from testkit.fake_upstream import FakeUpstream
from tests.gateway.dashboard.test_dashboard_browser import browser, card_values, screenshot, sign_in  # noqa: F401

QUESTION = "What does this gateway do for <my> agent & its tools?"
OTHER = "hi"


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("first_run")
    raw = yaml.safe_load((REPO / "config.example.yaml").read_text())
    raw["storage"] = {**raw["storage"], "url": f"sqlite:///{tmp / 'gateway.db'}", "blobs": {"dir": str(tmp / "blobs")}}
    with FakeUpstream() as fake:
        (fake_entry,) = [m for m in raw["models"] if m["name"] == "fake"]
        fake_entry["litellm_params"]["api_base"] = fake.api_base
        (tmp / "config.yaml").write_text(yaml.safe_dump(raw))
        gateway, server = start_gateway(load_settings(tmp / "config.yaml"), fake)
        try:
            demo = run_demo(gateway.url, TENANT_KEY, "demo", say=lambda _: None)
            client = openai.OpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)
            conversations = {}
            for opening in (QUESTION, OTHER):
                messages: list[Any] = [{"role": "user", "content": opening}]
                ids = []
                for follow_up in ("Tell me more.", "Thanks."):
                    raw_answer = client.chat.completions.with_raw_response.create(model="demo", messages=messages)
                    ids.append(raw_answer.headers["x-gateway-request-id"])
                    messages += [raw_answer.parse().choices[0].message, {"role": "user", "content": follow_up}]
                conversations[opening] = ids
            for _ in range(3):  # the first try and router.num_retries' two (the default)
                fake.script(status=500, error={"message": "the upstream fell over", "type": "server_error"})
            failed = client.chat.completions.with_raw_response
            with pytest.raises(openai.InternalServerError) as error:
                failed.create(model="fake", messages=[{"role": "user", "content": "this one fails"}])
            with gateway.client() as http:
                records = {opening: http.get(f"/api/requests/{ids[0]}").json() for opening, ids in conversations.items()}
                ledger = http.get("/api/savings").json()
            yield {"url": gateway.url, "demo": demo, "records": records, "ledger": ledger,
                   "failed": error.value.response.headers["x-gateway-request-id"], "gateway": gateway}
        finally:
            server.stop()


def test_money_figures_carry_the_demo_price(browser: Any, first_run: dict[str, Any]) -> None:  # noqa: F811
    context, page = sign_in(browser, first_run["url"], TENANT_KEY)
    totals = first_run["ledger"]["totals"]
    assert totals["cost_usd"] > 0 and totals["saved_usd"] > 0 and first_run["demo"].saved_usd > 0
    cards = card_values(page)
    assert float(cards["cost_usd"]) == pytest.approx(totals["cost_usd"]) and float(cards["saved_usd"]) > 0
    shown = page.inner_text("[data-metric=saved_usd]")
    assert shown.startswith("$") and shown != "$0.0000"
    unpriced = page.query_selector("#unpriced")
    assert unpriced is None or "demo" not in unpriced.inner_text()  # only the shipped `fake` entry has none
    screenshot(page, "first_run_overview.png")
    context.close()


def test_a_failed_run_shows_its_error_and_its_attempts(browser: Any, first_run: dict[str, Any]) -> None:  # noqa: F811
    context, page = sign_in(browser, first_run["url"], TENANT_KEY)
    failed = first_run["failed"]
    row = page.locator("#requests tbody tr", has=page.locator(f"a[href='/dashboard/requests/{failed}']"))
    assert "error" in row.inner_text()
    with page.expect_navigation():
        row.locator("a").click()
    assert page.inner_text("#run-status").startswith("error")
    assert "the upstream fell over" in page.inner_text("#run-error")
    attempts = page.eval_on_selector_all("#attempts tbody tr", "rows => rows.map(r => r.innerText)")
    assert len(attempts) == 3 and all("500" in a for a in attempts)
    screenshot(page, "first_run_failed_request.png")
    context.close()


def test_a_conversation_is_named_by_its_first_user_message(browser: Any, first_run: dict[str, Any]) -> None:  # noqa: F811
    context, page = sign_in(browser, first_run["url"], TENANT_KEY)
    records = first_run["records"]
    named = page.eval_on_selector_all(
        "#sessions tbody td.session-name", "cells => cells.map(c => [c.title, c.innerText.trim(), c.innerHTML])")
    by_id = {title: (shown, html) for title, shown, html in named}
    for opening, record in records.items():
        shown, html = by_id[record["conversation_id"]]
        assert shown == opening == record["conversation_name"]
    assert "&lt;my&gt;" in by_id[records[QUESTION]["conversation_id"]][1]  # text, escaped: no element made of it
    assert by_id[first_run["demo"].session][0] == first_run["demo"].session  # a label names its session
    rows = {s["session"]: s["requests"] for s in first_run["ledger"]["by_session"]}
    assert rows[records[QUESTION]["conversation_id"]] == rows[records[OTHER]["conversation_id"]] == 2
    names = page.eval_on_selector_all("#requests tbody td.session-name", "cells => cells.map(c => c.innerText.trim())")
    assert QUESTION in names and OTHER in names
    page.goto(f"{first_run['url']}/dashboard/requests/{records[QUESTION]['id']}")
    session = page.locator("#run-session")
    assert session.inner_text() == QUESTION and session.get_attribute("title") == records[QUESTION]["conversation_id"]
    context.close()
