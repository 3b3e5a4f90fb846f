"""Every dashboard response carries the security headers (gateway/dashboard/headers.py), and nothing
else gets them: the middleware around a small app, then the gateway's own pages over a socket."""
from __future__ import annotations

from typing import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.dashboard.headers import CONTENT_SECURITY_POLICY, DashboardHeaders
from testkit.gateway import TENANT_KEY, RunningGateway, dashboard_sign_in

EXPECTED = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
}


def assert_protected(response: httpx.Response, gateway: bool = True) -> None:
    """The middleware's headers, once each; and from the whole gateway, nosniff (gateway/edge/request_id.py)."""
    expected = {**EXPECTED, "x-content-type-options": "nosniff"} if gateway else EXPECTED
    for name, value in expected.items():
        assert response.headers.get_list(name) == [value], (response.url, name)
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]


def _app() -> DashboardHeaders:
    async def page(request):  # noqa: ANN001, ANN202
        return PlainTextResponse("page", headers={"x-frame-options": "SAMEORIGIN"})

    async def cached(request):  # noqa: ANN001, ANN202
        return PlainTextResponse("css", headers={"cache-control": "max-age=300"})

    routes = [Route("/dashboard", page), Route("/dashboard/style.css", cached),
              Route("/dashboard/gone", lambda r: RedirectResponse("/dashboard/login", status_code=303)),
              Route("/dashboardish", page), Route("/api/savings", lambda r: JSONResponse({}))]
    return DashboardHeaders(Starlette(routes=routes))


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(_app(), base_url="http://gw", follow_redirects=False) as client:
        yield client


def test_dashboard_paths_get_the_headers_in_place_of_their_own(client: TestClient) -> None:
    for path in ("/dashboard", "/dashboard/gone", "/dashboard/nowhere"):
        assert_protected(client.get(path), gateway=False)  # a page, a redirect, a 404
    assert client.get("/dashboard").headers["cache-control"] == "no-store"
    assert client.get("/dashboard/style.css").headers["cache-control"] == "max-age=300"  # its own stays


def test_other_paths_are_left_alone(client: TestClient) -> None:
    for path in ("/api/savings", "/dashboardish"):
        response = client.get(path)
        assert "content-security-policy" not in response.headers and "referrer-policy" not in response.headers


def test_every_page_of_the_gateways_dashboard_is_protected(module_gateway: RunningGateway) -> None:
    with httpx.Client(base_url=module_gateway.url, timeout=30) as browser:
        answers = [browser.get("/dashboard"), browser.get("/dashboard/login"),
                   browser.post("/dashboard/login", data={"api_key": TENANT_KEY})]  # refused: no token
        assert [a.status_code for a in answers] == [303, 200, 403]
        assert dashboard_sign_in(browser, TENANT_KEY).status_code == 303
        answers += [browser.get("/dashboard"), browser.get("/dashboard?start=yesterday"),
                    browser.get("/dashboard/requests/req_none"), browser.get("/dashboard/no/such/page"),
                    browser.get("/dashboard/style.css"), browser.get("/dashboard?model=%00")]
        assert [a.status_code for a in answers[3:]] == [200, 400, 404, 404, 200, 400]
        evaluation = [browser.get("/dashboard/evaluation"), browser.get("/dashboard/evaluation?from=yesterday")]
        assert [a.status_code for a in evaluation] == [200, 400]
        for answer in answers + evaluation:
            assert_protected(answer)
        stylesheet = answers[7]
        assert stylesheet.headers["content-type"].startswith("text/css") and "--fwd" in stylesheet.text
        for page in answers[:4] + evaluation:
            assert "style=" not in page.text and "<style" not in page.text and "<script" not in page.text
        healthz = browser.get("/healthz")
        assert "content-security-policy" not in healthz.headers
