"""The evaluation page in a real (headless) browser: reached from the navigation after signing in through the
form, its arms, rates, differences, verdict badges and shadow figures equal `GET /api/evaluation`'s, and a
tenant without enough data sees the notice saying so and how to get data.

The gateway is tests/gateway/dashboard/test_evaluation_page.py's: acme under `holdout_share: 0.5` with 48
conversations (more than twice `min_conversations`, so every arm can have a verdict) and shadows on every
projected request; globex with 6. A screenshot lands in test-output/screenshots/evaluation.png.

Uses Debian's chromium like tests/gateway/dashboard/test_dashboard_browser.py (skipped with the reason
without it, unless GATEWAY_TEST_REQUIRE_SERVICES=1, which makes it fail).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dashboard.evaluation_view import figure
from testkit.gateway import OTHER_TENANT_KEY, TENANT_KEY, RunningGateway
from tests.gateway.dashboard.test_dashboard_browser import browser, screenshot, sign_in  # noqa: F401
from tests.gateway.dashboard.test_evaluation_page import api_report, evaluated_gateway


@pytest.fixture(scope="module")
def evaluated(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:  # noqa: F811
    """After `browser`, so without chromium the module skips before sending any traffic."""
    with evaluated_gateway(tmp_path_factory.mktemp("evaluation_browser")) as gateway:
        yield gateway


def open_evaluation(browser: Any, gateway: RunningGateway, key: str) -> tuple[Any, Any]:  # noqa: F811
    """Signed in through the form, then to the evaluation page by the navigation's link."""
    context, page = sign_in(browser, gateway.url, key)
    with page.expect_navigation():
        page.click("#nav-evaluation")
    assert page.url == f"{gateway.url}/dashboard/evaluation"
    assert page.inner_text("h1").startswith("Evaluation")
    return context, page


def signal_rows(page: Any) -> dict[str, dict[str, Any]]:
    """Each row of the signals table as the browser renders it."""
    return {row["name"]: row for row in page.eval_on_selector_all("#signals tbody tr", """rows => rows.map(r => ({
        name: r.dataset.signal,
        rates: Object.fromEntries([...r.querySelectorAll('td[data-arm]')].map(c => [c.dataset.arm, c.dataset.rate])),
        texts: Object.fromEntries([...r.querySelectorAll('td[data-arm]')].map(
            c => [c.dataset.arm, c.querySelector('.rate').innerText.trim()])),
        difference: r.querySelector('.difference .rate').innerText.trim(),
        badge: r.querySelector('.verdict .badge').dataset.verdict,
        badgeText: r.querySelector('.verdict .badge').innerText.trim(),
        badgeColour: getComputedStyle(r.querySelector('.verdict .badge')).backgroundColor,
        words: r.querySelector('.verdict .words').innerText.trim(),
    }))""")}


def test_the_verdicts_and_rates_shown_are_the_apis(browser: Any, evaluated: RunningGateway) -> None:  # noqa: F811
    report = api_report(evaluated, TENANT_KEY)
    assert report["enough_data"] is True
    assert min(arm["conversations"] for arm in report["arms"].values()) >= report["min_conversations"]
    context, page = open_evaluation(browser, evaluated, TENANT_KEY)
    try:
        assert page.locator("#not-enough-data").count() == 0
        for arm, view in report["arms"].items():
            card = page.locator(f"#arms .card[data-arm='{arm}']")
            assert card.locator(".value").inner_text().startswith(f"{view['conversations']} conversation")
            assert card.locator("[data-requests]").inner_text() == f"{view['requests']:,}"
        rows = signal_rows(page)
        assert list(rows) == [signal["name"] for signal in report["signals"]]
        colours = {}
        for signal in report["signals"]:
            row, name = rows[signal["name"]], signal["name"]
            assert row["badge"] == signal["verdict"] and row["badgeText"] == signal["verdict"].replace("_", " ")
            assert row["words"], name
            colours.setdefault(signal["verdict"], set()).add(row["badgeColour"])
            for arm, view in signal["arms"].items():
                assert float(row["rates"][arm]) == view["rate"], (name, arm)
                assert row["texts"][arm] == figure(view["rate"], name), (name, arm)
            assert row["difference"] == figure(signal["difference"]["value"], name, signed=True), name
        assert set(colours) - {"insufficient_data"}, colours  # verdicts shown, not only "insufficient data"
        assert all(len(found) == 1 for found in colours.values())  # one colour per verdict...
        assert len({next(iter(found)) for found in colours.values()}) == len(colours)  # ...each its own
        assert "rgba(0, 0, 0, 0)" not in {c for found in colours.values() for c in found}  # the stylesheet applied
        shadow = report["shadow"]
        assert shadow["compared"] > 0
        assert page.get_attribute("#shadow [data-metric=compared]", "data-value") == str(shadow["compared"])
        assert float(page.get_attribute("#shadow [data-metric=agreement]", "data-value")) == shadow["agreement"]
        assert page.get_attribute("#shadow-verdict .badge", "data-verdict") == shadow["verdict"]
        screenshot(page, "evaluation.png")
    finally:
        context.close()


def test_a_tenant_without_enough_data_sees_the_notice(browser: Any, evaluated: RunningGateway) -> None:  # noqa: F811
    report = api_report(evaluated, OTHER_TENANT_KEY)
    assert report["enough_data"] is False
    context, page = open_evaluation(browser, evaluated, OTHER_TENANT_KEY)
    try:
        notice = page.locator("#not-enough-data")
        assert notice.is_visible()
        text = notice.inner_text()
        assert "Not enough data yet" in text and "evaluation.holdout_share" in text
        for arm, view in report["arms"].items():
            assert page.inner_text(f"#not-enough-data [data-arm-conversations='{arm}']") == str(view["conversations"])
        assert page.inner_text("#min-conversations") == str(report["min_conversations"])
        badges = page.eval_on_selector_all("#signals .verdict .badge", "els => els.map(e => e.dataset.verdict)")
        assert badges == [signal["verdict"] for signal in report["signals"]]
        assert "tenant globex" in page.inner_text("header")
        screenshot(page, "evaluation_not_enough_data.png")
    finally:
        context.close()
