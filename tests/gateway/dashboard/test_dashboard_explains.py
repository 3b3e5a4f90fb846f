"""The dashboard explains itself, in a real browser: a failed run's error and every attempt, what the
counts count, a model without a price said as such, content as text, no compaction line before any.

One gateway, two deployments of `fake` (the first answers 500, so a request shows two attempts), a
priced model and an unpriced one. Uses Debian's chromium like tests/gateway/dashboard/test_dashboard_browser.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from testkit.gateway import TENANT_KEY, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream
from tests.gateway.dashboard.test_dashboard_browser import browser, sign_in  # noqa: F401 (the module's browser fixture)

QUOTED = "It's \"quoted\" & <tagged>: Ünïcode too"


@pytest.fixture(scope="module")
def explained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("explained")
    with FakeUpstream() as fake, FakeUpstream() as second:
        priced = {"input_cost_per_token": 2e-6, "output_cost_per_token": 8e-6}
        settings = settings_for(fake.api_base, f"sqlite:///{tmp / 'gateway.db'}", tmp, models=[
            {"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": fake.api_base,
                                                "api_key": "sk-upstream", "order": 1, **priced}},
            {"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": second.api_base,
                                                "api_key": "sk-upstream", "order": 2, **priced}},
            {"name": "free", "litellm_params": {"model": "openai/no-such-price", "api_base": second.api_base,
                                                "api_key": "sk-upstream"}},
        ], router={"num_retries": 1})
        gateway, server = start_gateway(settings, fake)
        try:
            with gateway.client(key=TENANT_KEY) as http:
                fake.script(status=500, error={"message": "the first deployment broke", "type": "server_error"})
                second.script(status=503, error={"message": "the second is overloaded too", "type": "overloaded"})
                failed = http.post("/v1/chat/completions",
                                   json={"model": "fake", "messages": [{"role": "user", "content": "fail please"}]})
                assert failed.status_code >= 500
                unpriced = http.post("/v1/chat/completions",
                                     json={"model": "free", "messages": [  # content parts, as SDKs send them
                                         {"role": "user", "content": [{"type": "text", "text": QUOTED}]}]})
                assert unpriced.status_code == 200, unpriced.text
            yield {"url": gateway.url, "failed": failed.headers["x-gateway-request-id"],
                   "unpriced": unpriced.headers["x-gateway-request-id"], "gateway": gateway}
        finally:
            server.stop()


def test_a_failed_run_shows_its_error_and_every_attempt(browser: Any, explained: dict[str, Any]) -> None:  # noqa: F811
    context, page = sign_in(browser, explained["url"], TENANT_KEY)
    with explained["gateway"].client(key=TENANT_KEY) as http:
        record = http.get(f"/api/requests/{explained['failed']}").json()
    assert len(record["attempts"]) == 2
    page.goto(f"{explained['url']}/dashboard/requests/{explained['failed']}")
    assert page.inner_text("#run-status").startswith(record["status"])
    error = page.inner_text("#run-error")
    assert record["error"]["type"] in error and record["error"]["message"] in error
    rows = page.eval_on_selector_all("#attempts tbody tr", "rows => rows.map(r => r.innerText)")
    assert len(rows) == 2
    for row, attempt in zip(rows, record["attempts"]):
        assert attempt["deployment"] in row and attempt["outcome"] in row and str(attempt["http_status"]) in row
    context.close()


def test_an_unpriced_model_says_so_and_content_reads_as_text(browser: Any, explained: dict[str, Any]) -> None:  # noqa: F811
    context, page = sign_in(browser, explained["url"], TENANT_KEY)
    assert "No price for free" in page.inner_text("#unpriced")
    cards = page.inner_text("#totals")
    assert "REQUESTS ANSWERED" in cards.upper() and "failed ones are not counted" in cards
    assert "as the provider counts them" in cards
    page.goto(f"{explained['url']}/dashboard/requests/{explained['unpriced']}")
    assert page.inner_text("#run-cost") == "no price"
    assert page.inner_text("#epoch") == "nothing compacted yet (the transcript is under the policy's threshold)"
    inspector = page.inner_text("#inspector")
    assert QUOTED in inspector and "\\u0027" not in inspector
    assert page.query_selector("#run-error") is None and page.query_selector("#retention-note") is None
    context.close()
