"""The dashboard against another site and a stale cookie, in a real (headless) Chromium.

One gateway (three models; acme without a model list, globex allowed two)
and one attacker's server on another port serve the module. The attacker is
reached two ways: as `localhost` (another site) and as `127.0.0.1` on its own
port (the same site, another origin: SameSite cookies do not stop it). The
tests check that

- a page there auto-posting a sign-in form to the gateway (with the
  attacker's tenant key, and a form token the attacker got for itself) is
  refused with a 403 page and signs the browser into nothing;
- a page there framing the dashboard gets an empty frame, while its own
  frame beside it renders;
- a cookie copied before signing out lands on the sign-in page afterwards;
- a made key revoked through `/api/keys` ends its browser's session at the
  next page load;
- each tenant's model filter lists only its models (the admin's: all);
- the pages run under their CSP without a violation, styled by the one stylesheet.

Uses Debian's chromium at /usr/bin/chromium (see tests/gateway/dashboard/test_dashboard_browser.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any, Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from testkit.gateway import (
    ADMIN_KEY,
    OTHER_TENANT_KEY,
    TENANT_KEY,
    RunningGateway,
    dashboard_form_token,
    settings_for,
    start_gateway,
)
from testkit.fake_upstream import FakeUpstream, ServerThread
from tests.gateway.dashboard.test_dashboard_browser import browser, sign_in  # noqa: F401 (a fixture and a helper)

MODELS = ("fake", "demo", "third")


@dataclass
class Sites:
    gateway: RunningGateway
    attacker_port: int

    @property
    def url(self) -> str:
        return self.gateway.url

    def attacker(self, host: str) -> str:
        return f"http://{host}:{self.attacker_port}"


def _attacker_app(gateway_url: str, token: str) -> Starlette:
    """The other site: a page that posts the sign-in form as soon as it loads, and one that frames."""

    async def autopost(request: Request) -> HTMLResponse:
        key = escape(request.query_params["key"])
        return HTMLResponse(
            f'<form method="post" action="{gateway_url}/dashboard/login">'
            f'<input name="api_key" value="{key}"><input name="csrf_token" value="{token}"></form>'
            "<script>document.forms[0].submit()</script>")

    async def frame(request: Request) -> HTMLResponse:
        path = escape(request.query_params["path"])
        return HTMLResponse(f'<iframe name="target" src="{gateway_url}{path}" width="800" height="600"></iframe>'
                            '<iframe name="control" src="/own"></iframe>')

    async def own(request: Request) -> HTMLResponse:
        return HTMLResponse('<p id="own">the framing site\'s own page</p>')

    return Starlette(routes=[Route("/autopost", autopost), Route("/frame", frame), Route("/own", own)])


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sites]:
    tmp = tmp_path_factory.mktemp("attacks")
    with FakeUpstream() as fake:
        models = [{"name": name, "litellm_params": {"model": f"openai/{name}", "api_base": fake.api_base,
                                                     "api_key": "sk-upstream"}} for name in MODELS]
        settings = settings_for(fake.api_base, f"sqlite:///{tmp / 'gateway.db'}", tmp, models=models, tenants=[
            {"id": "acme", "api_keys": [TENANT_KEY]},
            {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "models": ["fake", "demo"]}])
        gateway, server = start_gateway(settings, fake)
        with gateway.client(TENANT_KEY) as http:  # acme's records name one model
            fake.script_message({"role": "assistant", "content": "hi"})
            assert http.post("/v1/chat/completions", json={
                "model": "fake", "messages": [{"role": "user", "content": "hello"}]}).status_code == 200
        with httpx.Client(base_url=gateway.url, timeout=30) as attacker_session:
            token = dashboard_form_token(attacker_session)  # a real token, bound to the attacker's own cookie
        attacker = ServerThread(_attacker_app(gateway.url, token)).start()
        try:
            yield Sites(gateway, attacker.port)
        finally:
            attacker.stop()
            server.stop()


def _session_cookies(context: Any) -> list[dict[str, Any]]:
    return [c for c in context.cookies() if c["name"] == "gw_session"]


def _lands_on_sign_in(page: Any, sites: Sites) -> bool:
    page.goto(f"{sites.url}/dashboard")
    return page.url == f"{sites.url}/dashboard/login"


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"], ids=["cross-site", "same-site"])
def test_a_sign_in_posted_by_another_site_signs_nobody_in(browser: Any, sites: Sites, host: str) -> None:  # noqa: F811
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(f"{sites.url}/dashboard/login")  # the victim has been here: it holds a form cookie
        with page.expect_navigation(url=f"{sites.url}/dashboard/login") as posted:
            page.goto(f"{sites.attacker(host)}/autopost?key={OTHER_TENANT_KEY}")
        assert posted.value.status == 403
        refusal = page.inner_text("#refusal")
        assert "refused" in refusal and ("another site" in refusal or sites.attacker(host) in refusal), refusal
        assert _session_cookies(context) == []
        assert _lands_on_sign_in(page, sites)
    finally:
        context.close()


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"], ids=["cross-site", "same-site"])
def test_another_site_framing_the_dashboard_gets_an_empty_frame(browser: Any, sites: Sites,  # noqa: F811
                                                                 host: str) -> None:
    context, page = sign_in(browser, sites.url, TENANT_KEY)  # signed in: a frame would show acme's figures
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text))
    try:
        for path in ("/dashboard", "/dashboard/login"):
            page.goto(f"{sites.attacker(host)}/frame?path={path}")
            page.frame(name="control").wait_for_selector("#own")  # frames work on that page
            target = page.frame(name="target")
            assert target is not None
            assert not target.url.startswith(sites.url), target.url
            assert target.locator("#totals").count() == 0 and target.locator("#api_key").count() == 0
        assert any("frame-ancestors" in line for line in console), console
    finally:
        context.close()


def test_a_cookie_copied_before_sign_out_lands_on_the_sign_in_page(browser: Any, sites: Sites) -> None:  # noqa: F811
    context, page = sign_in(browser, sites.url, TENANT_KEY)
    copied = _session_cookies(context)
    replay = browser.new_context()
    try:
        replay.add_cookies(copied)
        replay_page = replay.new_page()
        replay_page.goto(f"{sites.url}/dashboard")
        assert replay_page.url == f"{sites.url}/dashboard"  # the copy works while the session lives
        with page.expect_navigation():
            page.click("#sign-out")
        assert page.url == f"{sites.url}/dashboard/login"
        assert _session_cookies(context) == []
        assert _lands_on_sign_in(replay_page, sites)  # the copy signs nobody in now
        fresh = browser.new_context()
        fresh.add_cookies(copied)
        assert _lands_on_sign_in(fresh.new_page(), sites)
        fresh.close()
    finally:
        replay.close()
        context.close()


def test_a_key_revoked_through_the_api_ends_its_browser_session(browser: Any, sites: Sites) -> None:  # noqa: F811
    with sites.gateway.client(ADMIN_KEY) as admin:
        made = admin.post("/api/keys", json={"tenant": "acme", "name": "dashboard"}).json()
    context, page = sign_in(browser, sites.url, made["key"])
    try:
        assert "tenant acme" in page.inner_text("header")
        page.reload()
        assert page.url == f"{sites.url}/dashboard"
        with sites.gateway.client(ADMIN_KEY) as admin:
            assert admin.delete(f"/api/keys/{made['id']}").status_code == 200
        page.reload()  # the very next page load
        assert page.url == f"{sites.url}/dashboard/login"
        page.fill("input[name=api_key]", made["key"])
        with page.expect_navigation() as again:
            page.click("#sign-in")
        assert again.value.status == 401 and "revoked" in page.inner_text("#login-error")
    finally:
        context.close()


def _model_options(page: Any) -> list[str]:
    return page.eval_on_selector_all("#model-filter option", "options => options.map(o => o.value)")[1:]


def test_each_tenants_model_filter_lists_only_its_models(browser: Any, sites: Sites) -> None:  # noqa: F811
    with sites.gateway.client(ADMIN_KEY) as admin:
        narrowed = admin.post("/api/keys", json={"tenant": "globex", "models": ["demo"]}).json()
    for key, expected in ((TENANT_KEY, ["fake"]),  # no list in the config: the models its records name
                          (OTHER_TENANT_KEY, ["fake", "demo"]),  # its `models`
                          (narrowed["key"], ["demo"]),  # a made key narrows its tenant's list
                          (ADMIN_KEY, list(MODELS))):
        context, page = sign_in(browser, sites.url, key)
        try:
            assert _model_options(page) == expected, key
            assert "third" not in page.content() or key == ADMIN_KEY
        finally:
            context.close()


def test_pages_render_under_their_policy_without_violations(browser: Any, sites: Sites) -> None:  # noqa: F811
    context = browser.new_context()
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text))
    try:
        page.goto(f"{sites.url}/dashboard/login")
        assert page.eval_on_selector(".panel", "e => getComputedStyle(e).maxWidth") == "420px"
        page.fill("input[name=api_key]", TENANT_KEY)
        with page.expect_navigation():
            page.click("#sign-in")
        assert page.eval_on_selector("header", "e => getComputedStyle(e).backgroundColor") == "rgb(17, 24, 39)"
        assert page.locator("svg.chart rect").count() > 0
        assert page.eval_on_selector(".legend i.sw-fwd", "e => getComputedStyle(e).backgroundColor") \
            == "rgb(37, 99, 235)"
        with page.expect_navigation():
            page.locator("#requests a").first.click()
        assert page.locator("#inspector").is_visible()
        assert not [line for line in console if "Content Security Policy" in line], console
    finally:
        context.close()
