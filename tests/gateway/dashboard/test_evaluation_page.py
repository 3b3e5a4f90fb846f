"""The dashboard's evaluation page (issue 31) shows what `GET /api/evaluation` answers, scoped like the API.

One gateway serves the module: tenant acme under coding-agent with `evaluation.holdout_share: 0.5` and
`shadow_share: 1.0` (every projected request compared), 48 short conversations of the evaluation tests'
fake agent (tests/gateway/evaluation/test_arms.py: a read, sometimes the same read again, an answer);
tenant globex under the same holdout with 6 conversations of its own. The model is priced, so cost and
shadow spend are not zero. Signed in through the form (httpx, as a browser posts it), the page's figures,
read from its `data-` attributes, equal the API's for the same filters; each tenant sees its own; a filter
that matches nothing says there is not enough data yet and how to get it; a bad filter is a 400 page.
tests/gateway/dashboard/test_evaluation_browser.py drives the same page in Chromium.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.dashboard.evaluation_view import figure
from gateway.dashboard.headers import CONTENT_SECURITY_POLICY
from policies.presets import _PRESETS
from testkit.fake_upstream import FakeUpstream
from testkit.gateway import (
    ADMIN_KEY,
    OTHER_TENANT_KEY,
    TENANT_KEY,
    RunningGateway,
    dashboard_sign_in,
    settings_for,
    start_gateway,
)
from tests.gateway.evaluation.test_arms import converse, model

ACME_CONVERSATIONS = 48
GLOBEX_CONVERSATIONS = 6
GLOBEX_FIRST_TASK = 1000
PRICES = {"input_cost_per_token": 3e-6, "output_cost_per_token": 1.5e-5}
VERDICTS = {"better", "worse", "no_difference", "insufficient_data"}


def evaluated_policy() -> dict[str, Any]:
    raw = json.loads(json.dumps(_PRESETS["coding-agent"]))
    raw["evaluation"] = {"holdout_share": 0.5, "shadow_share": 1.0, "shadow_budget_usd_per_day": 10.0}
    return raw


def wait_for_shadows(gateway: RunningGateway, key: str, timeout: float = 60.0) -> dict[str, Any]:
    """The report once every projected request's shadow comparison is recorded (they run after the answer)."""
    deadline = time.monotonic() + timeout
    with gateway.client(key) as client:
        while time.monotonic() < deadline:
            report = client.get("/api/evaluation").json()
            if report["shadow"]["compared"] == report["arms"]["projected"]["requests"]:
                return report
            time.sleep(0.2)
    raise AssertionError(f"shadows not all recorded: {report['shadow']} of {report['arms']}")


@contextmanager
def evaluated_gateway(tmp: Path) -> Iterator[RunningGateway]:
    """The module's gateway with its traffic sent and its shadows recorded."""
    with FakeUpstream() as fake:
        (tmp / "evaluated.yaml").write_text(yaml.safe_dump(evaluated_policy()))
        tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "evaluated.yaml"},
                   {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "policy": "evaluated.yaml"}]
        models = [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": fake.api_base,
                                                      "api_key": "sk-upstream", **PRICES}}]
        settings = settings_for(fake.api_base, f"sqlite:///{tmp / 'gateway.db'}", tmp, tenants=tenants,
                                models=models)
        gateway, server = start_gateway(settings, fake)
        try:
            fake.state.chat_responder = model
            for key, tasks in ((TENANT_KEY, range(ACME_CONVERSATIONS)),
                               (OTHER_TENANT_KEY, range(GLOBEX_FIRST_TASK, GLOBEX_FIRST_TASK + GLOBEX_CONVERSATIONS))):
                with gateway.client(key) as client:
                    for n in tasks:
                        converse(client, n)
                wait_for_shadows(gateway, key)
            yield gateway
        finally:
            server.stop()


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with evaluated_gateway(tmp_path_factory.mktemp("evaluation_page")) as gateway:
        yield gateway


def api_report(gateway: RunningGateway, key: str, **params: str) -> dict[str, Any]:
    with gateway.client(key) as client:
        response = client.get("/api/evaluation", params=params)
    assert response.status_code == 200, response.text
    return response.json()


@contextmanager
def dashboard(gateway: RunningGateway, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        assert dashboard_sign_in(client, key).status_code == 303
        yield client


# --- reading the page ------------------------------------------------------------------------------

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def _matches(element: Element, attrs: dict[str, str | None]) -> bool:
    """`class_`: one of its classes; None: the attribute is there, whatever its value."""
    for name, value in attrs.items():
        if name == "class_":
            if value not in element.attrs.get("class", "").split():
                return False
        elif value is None and name not in element.attrs or value is not None and element.attrs.get(name) != value:
            return False
    return True


class Element:
    def __init__(self, tag: str, attrs: dict[str, str]) -> None:
        self.tag, self.attrs = tag, attrs
        self.children: list[Element] = []
        self.parts: list[str] = []

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.parts + [child.text for child in self.children]).split())

    def all(self, **attrs: str | None) -> list[Element]:
        found = []
        for child in self.children:
            if _matches(child, attrs):
                found.append(child)
            found += child.all(**attrs)
        return found

    def one(self, **attrs: str | None) -> Element:
        (found,) = self.all(**attrs)
        return found


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.root = Element("root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {name: value or "" for name, value in attrs})
        self.stack[-1].children.append(element)
        if tag not in _VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Element(tag, {name: value or "" for name, value in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].parts.append(data)


def parse(html: str) -> Element:
    builder = _Builder()
    builder.feed(html)
    return builder.root


def _number(value: str) -> float | None:
    return None if value == "" else float(value)


def shown(html: str) -> dict[str, Any]:
    """The page's figures, in the report's shape, read from its data- attributes and texts."""
    page = parse(html)
    arms = {card.attrs["data-arm"]: {
        "conversations": int(card.one(**{"data-conversations": None}).attrs["data-conversations"]),
        "requests": int(card.one(**{"data-requests": None}).attrs["data-requests"]),
        "share": _number(card.one(**{"data-share": None}).attrs["data-share"])}
        for card in page.one(id="arms").all(class_="card", **{"data-arm": None})}
    signals = {}
    for row in page.one(id="signals").all(**{"data-signal": None}):
        cells = {cell.attrs["data-arm"]: cell for cell in row.all(**{"data-arm": None})}
        difference = row.one(class_="difference")
        signals[row.attrs["data-signal"]] = {
            "rates": {arm: _number(cell.attrs["data-rate"]) for arm, cell in cells.items()},
            "texts": {arm: cell.one(class_="rate").text for arm, cell in cells.items()},
            "intervals": {arm: cell.one(class_="interval").text for arm, cell in cells.items()},
            "difference": _number(difference.attrs["data-difference"]),
            "difference_text": difference.one(class_="rate").text,
            "verdict": row.one(class_="verdict").one(**{"data-verdict": None}).attrs["data-verdict"],
            "words": row.one(class_="words").text}
    shadow = {cell.attrs["data-metric"]: _number(cell.attrs["data-value"])
              for cell in page.one(id="shadow").all(**{"data-metric": None})}
    shadow["verdict"] = page.one(id="shadow-verdict").one(**{"data-verdict": None}).attrs["data-verdict"]
    return {"arms": arms, "signals": signals, "shadow": shadow, "page": page}


def assert_shows(html: str, report: dict[str, Any]) -> dict[str, Any]:
    """Every figure of the report is on the page: arms, each signal's rates (as data and as text),
    difference and verdict, the shadow comparisons."""
    page = shown(html)
    assert page["arms"] == {arm: {key: view[key] for key in ("conversations", "requests", "share")}
                            for arm, view in report["arms"].items()}
    assert list(page["signals"]) == [signal["name"] for signal in report["signals"]]
    for signal in report["signals"]:
        on_page = page["signals"][signal["name"]]
        assert on_page["rates"] == {arm: view["rate"] for arm, view in signal["arms"].items()}, signal["name"]
        assert on_page["texts"] == {arm: figure(view["rate"], signal["name"])
                                    for arm, view in signal["arms"].items()}, signal["name"]
        for arm, view in signal["arms"].items():
            if view["interval"]:
                low, high = (figure(bound, signal["name"]) for bound in view["interval"])
                assert on_page["intervals"][arm] == f"[{low}, {high}]", signal["name"]
        difference = signal["difference"]["value"] if signal["difference"] else None
        assert on_page["difference"] == difference, signal["name"]
        assert on_page["difference_text"] == figure(difference, signal["name"], signed=True)
        assert on_page["verdict"] == signal["verdict"] and on_page["verdict"] in VERDICTS
        assert on_page["words"]  # the verdict said in words
    shadow = report["shadow"]
    assert page["shadow"] == {"compared": shadow["compared"], "agreement": shadow["agreement"],
                              "mean_similarity": shadow["mean_similarity"], "spend_usd": shadow["spend_usd"],
                              "verdict": shadow["verdict"]}
    return page


def form_value(page: Element, name: str) -> str:
    """What the filter form holds for `name`: an input's value, a select's selected option."""
    field = page.one(name=name)
    if field.tag == "select":
        return next((option.attrs["value"] for option in field.all(selected=None)), "")
    return field.attrs.get("value", "")


def _today() -> str:
    return datetime.now(UTC).date().isoformat()


@pytest.mark.parametrize("filters", [{}, {"model": "fake"}, {"policy_version": "(the tenant's)"},
                                     {"from": "(today)", "to": "(today)"}],
                         ids=["none", "model", "policy_version", "from_to"])
def test_the_page_shows_the_apis_figures_for_the_same_filters(evaluated: RunningGateway,
                                                              filters: dict[str, str]) -> None:
    everything = api_report(evaluated, TENANT_KEY)
    (version,) = everything["policy_versions"]
    filters = {name: {"(today)": _today(), "(the tenant's)": version}.get(value, value)
               for name, value in filters.items()}
    report = api_report(evaluated, TENANT_KEY, **filters)
    assert report["enough_data"] is True
    assert sum(view["conversations"] for view in report["arms"].values()) == ACME_CONVERSATIONS
    assert report["shadow"]["compared"] == report["arms"]["projected"]["requests"] > 0
    assert report["shadow"]["spend_usd"] > 0
    with dashboard(evaluated, TENANT_KEY) as client:
        response = client.get("/dashboard/evaluation", params=filters)
    assert response.status_code == 200, response.text
    page = assert_shows(response.text, report)
    assert not page["page"].all(id="not-enough-data")
    assert {s["verdict"] for s in page["signals"].values()} - {"insufficient_data"}  # verdicts, not just "no data"
    assert "tenant acme" in response.text and not page["page"].all(id="tenant-filter")  # no tenant filter
    for name, value in filters.items():  # the form shows the filters applied
        assert form_value(page["page"], name) == value


def test_a_tenant_sees_its_own_evaluation_and_no_other(evaluated: RunningGateway) -> None:
    with dashboard(evaluated, OTHER_TENANT_KEY) as client:
        own = client.get("/dashboard/evaluation")
        other = client.get("/dashboard/evaluation", params={"tenant": "acme"})
    report = api_report(evaluated, OTHER_TENANT_KEY)
    page = assert_shows(own.text, report)
    assert sum(arm["conversations"] for arm in page["arms"].values()) == GLOBEX_CONVERSATIONS
    notice = page["page"].one(id="not-enough-data")  # 6 conversations: fewer than min_conversations in each arm
    assert "are being held out" in notice.text and not notice.all(id="nothing-matches")
    assert other.status_code == 404 and "No tenant" in parse(other.text).one(id="error").text
    assert not parse(other.text).all(id="signals")
    assert api_report(evaluated, TENANT_KEY)["arms"] != report["arms"]  # acme's would have shown otherwise


def test_an_admin_sees_every_tenant_and_filters_by_one(evaluated: RunningGateway) -> None:
    with dashboard(evaluated, ADMIN_KEY) as client:
        everyone = client.get("/dashboard/evaluation")
        globex = client.get("/dashboard/evaluation", params={"tenant": "globex", "model": "", "from": ""})
    page = assert_shows(everyone.text, api_report(evaluated, ADMIN_KEY))
    assert sum(arm["conversations"] for arm in page["arms"].values()) == ACME_CONVERSATIONS + GLOBEX_CONVERSATIONS
    filtered = assert_shows(globex.text, api_report(evaluated, ADMIN_KEY, tenant="globex"))
    assert sum(arm["conversations"] for arm in filtered["arms"].values()) == GLOBEX_CONVERSATIONS
    chosen = filtered["page"].one(id="tenant-filter").one(value="globex")
    assert "selected" in chosen.attrs


def test_a_filter_that_matches_nothing_says_there_is_not_enough_data(evaluated: RunningGateway) -> None:
    filters = {"from": "2001-01-01", "to": "2001-01-31"}
    report = api_report(evaluated, TENANT_KEY, **filters)
    assert report["enough_data"] is False
    with dashboard(evaluated, TENANT_KEY) as client:
        response = client.get("/dashboard/evaluation", params=filters)
    assert response.status_code == 200
    page = assert_shows(response.text, report)
    notice = page["page"].one(id="not-enough-data")
    assert "Not enough data yet" in notice.text and notice.all(id="nothing-matches")
    assert "evaluation.holdout_share" in notice.text and "evaluation.shadow_share" in notice.text
    assert notice.one(id="min-conversations").text == str(report["min_conversations"])
    assert {cell.attrs["data-arm-conversations"]: cell.text for cell in notice.all(**{"data-arm-conversations": None})} \
        == {"projected": "0", "holdout": "0"}
    assert {s["verdict"] for s in page["signals"].values()} == {"insufficient_data"}


@pytest.mark.parametrize("query", ["from=yesterday", "to=2024-13-45", "from=%3Cb%3Enow%3C%2Fb%3E"])
def test_a_bad_filter_is_an_error_page_not_a_failure(evaluated: RunningGateway, query: str) -> None:
    with dashboard(evaluated, TENANT_KEY) as client:
        response = client.get(f"/dashboard/evaluation?{query}")
    assert response.status_code == 400
    error = parse(response.text).one(id="error")
    assert "is not an ISO date or datetime" in error.text
    assert "<b>" not in response.text  # said as text
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


def test_the_page_is_linked_signed_in_only_and_keeps_the_csp(evaluated: RunningGateway) -> None:
    with httpx.Client(base_url=evaluated.url, timeout=30) as anonymous:
        response = anonymous.get("/dashboard/evaluation")
        assert response.status_code == 303 and response.headers["location"] == "/dashboard/login"
    with dashboard(evaluated, TENANT_KEY) as client:
        overview = client.get("/dashboard")
        response = client.get("/dashboard/evaluation")
    assert parse(overview.text).one(id="nav-evaluation").attrs["href"] == "/dashboard/evaluation"
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["cache-control"] == "no-store"
    assert "style=" not in response.text and "<style" not in response.text and "<script" not in response.text


def test_each_signal_shows_in_its_unit() -> None:
    assert figure(0.5, "final_answer_share") == "50.0%" and figure(0.025, "final_answer_share", signed=True) == "+2.5 pp"
    assert figure(-0.0013, "cost_per_conversation", signed=True) == "-$0.001300"
    assert figure(0.0042, "cost_per_conversation", signed=True) == "+$0.004200"
    assert figure(1978.94, "tokens_sent_per_conversation") == "1,978.9"
    assert figure(0.15789, "repeated_calls_per_request") == "0.158" and figure(None, "x") == "–"
