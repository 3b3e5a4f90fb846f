"""Dashboard posts from other sites are refused (gateway/dashboard/form_guard.py): by the browser's own
headers when it sends them, by the form token when it does not.

The first tests call the checks on hand-built requests; the last ones post to a running gateway the
way a browser, an attacker's page and a scripted client would."""
from __future__ import annotations

import httpx
import pytest
from starlette.requests import Request

from gateway.access.dashboard_sessions import SessionSigner
from gateway.dashboard import form_guard as guard
from testkit.gateway import TENANT_KEY, RunningGateway, dashboard_form_token

SIGNER = SessionSigner("test-secret")
COOKIE = "c" * 43


def request(headers: dict[str, str] | None = None, host: str = "gw.example:8080", scheme: str = "http",
            cookie: str | None = COOKIE) -> Request:
    raw = {"host": host, **(headers or {})}
    if cookie is not None:
        raw["cookie"] = f"{guard.CSRF_COOKIE}={cookie}"
    return Request({"type": "http", "method": "POST", "scheme": scheme, "path": "/dashboard/login",
                    "query_string": b"", "server": ("gw.example", 8080),
                    "headers": [(k.lower().encode(), v.encode()) for k, v in raw.items()]})


TOKEN = guard.token_for(SIGNER, COOKIE)


def test_a_same_origin_post_with_its_token_goes_ahead() -> None:
    headers = {"origin": "http://gw.example:8080", "sec-fetch-site": "same-origin"}
    assert guard.refusal(request(headers), SIGNER, TOKEN) is None
    assert guard.refusal(request(), SIGNER, TOKEN) is None  # an old browser: neither header, the token suffices
    assert guard.refusal(request({"sec-fetch-site": "none"}), SIGNER, TOKEN) is None  # the user's own action


@pytest.mark.parametrize("origin", ["http://evil.example", "http://gw.example:8081", "https://gw.example:8080",
                                    "http://gw.example", "null", "http://gw.example:8080.evil.example"])
def test_an_origin_other_than_the_gateways_is_refused(origin: str) -> None:
    reason = guard.refusal(request({"origin": origin}), SIGNER, TOKEN)  # even with a good token
    assert reason is not None and f"sent from {origin}" in reason


@pytest.mark.parametrize("site", ["cross-site", "same-site", "CROSS-SITE"])
def test_sec_fetch_site_from_elsewhere_is_refused(site: str) -> None:
    reason = guard.refusal(request({"sec-fetch-site": site, "origin": "http://gw.example:8080"}), SIGNER, TOKEN)
    assert reason is not None and f"Sec-Fetch-Site: {site}" in reason


@pytest.mark.parametrize("token, cookie", [("", COOKIE), (TOKEN, None), ("0" * 64, COOKIE),
                                           (guard.token_for(SIGNER, "d" * 43), COOKIE),
                                           (guard.token_for(SessionSigner("other"), COOKIE), COOKIE)],
                         ids=["no token", "no cookie", "wrong token", "another cookie's token",
                              "another secret's token"])
def test_a_post_without_its_token_is_refused(token: str, cookie: str | None) -> None:
    reason = guard.refusal(request({"origin": "http://gw.example:8080"}, cookie=cookie), SIGNER, token)
    assert reason is not None and "form token" in reason


def test_the_origin_a_proxy_in_front_names_is_the_gateways_own() -> None:
    forwarded = {"x-forwarded-proto": "https", "x-forwarded-host": "dash.example.com"}
    assert guard.refusal(request({**forwarded, "origin": "https://dash.example.com"}), SIGNER, TOKEN) is None
    assert guard.refusal(request({"origin": "https://gw.example"}, host="gw.example:443", scheme="https"),
                         SIGNER, TOKEN) is None  # the default port, named or not
    assert guard.refusal(request({**forwarded, "origin": "https://evil.example"}), SIGNER, TOKEN) is not None


def test_a_page_gets_a_new_cookie_only_when_it_has_none() -> None:
    assert guard.form_cookie(request()) == (COOKIE, False)
    fresh, new = guard.form_cookie(request(cookie=None))
    assert new and len(fresh) >= 40 and fresh != COOKIE
    assert guard.form_cookie(request(cookie="short"))[1] is True


# --- against a running gateway -----------------------------------------------------------------------


def _signed_in(client: httpx.Client) -> bool:
    return client.get("/dashboard").status_code == 200


@pytest.mark.parametrize("headers, words", [
    ({"origin": "http://attacker.example"}, "sent from http://attacker.example"),
    ({"sec-fetch-site": "cross-site"}, "Sec-Fetch-Site: cross-site"),
    ({"sec-fetch-site": "same-site", "origin": "http://127.0.0.1:1"}, "Sec-Fetch-Site: same-site"),
], ids=["origin", "cross-site", "same-site"])
def test_a_cross_site_sign_in_is_a_403_page_and_signs_nobody_in(module_gateway: RunningGateway,
                                                               headers: dict[str, str], words: str) -> None:
    with httpx.Client(base_url=module_gateway.url, timeout=30) as client:
        token = dashboard_form_token(client)  # even holding a good token and cookie
        response = client.post("/dashboard/login", data={"api_key": TENANT_KEY, "csrf_token": token},
                               headers=headers)
        assert response.status_code == 403
        assert response.headers["content-type"].startswith("text/html")
        assert words in response.text and 'id="refused"' in response.text
        assert "gw_session" not in response.cookies and not _signed_in(client)


def test_a_sign_in_without_the_forms_token_is_refused(module_gateway: RunningGateway) -> None:
    with httpx.Client(base_url=module_gateway.url, timeout=30) as client:  # sends no Origin, no Sec-Fetch-Site
        response = client.post("/dashboard/login", data={"api_key": TENANT_KEY})
        assert response.status_code == 403 and "form token" in response.text
        assert not _signed_in(client)
        token = dashboard_form_token(client)
        response = client.post("/dashboard/login", data={"api_key": TENANT_KEY, "csrf_token": token},
                               headers={"origin": module_gateway.url, "sec-fetch-site": "same-origin"})
        assert response.status_code == 303 and _signed_in(client)


def test_sign_out_needs_its_token_and_ends_the_session_on_the_server(module_gateway: RunningGateway) -> None:
    with httpx.Client(base_url=module_gateway.url, timeout=30) as client:
        token = dashboard_form_token(client)
        assert client.post("/dashboard/login", data={"api_key": TENANT_KEY, "csrf_token": token}).status_code == 303
        copied = client.cookies["gw_session"]
        forced = client.post("/dashboard/logout", headers={"origin": "http://attacker.example"},
                             data={"csrf_token": token})
        assert forced.status_code == 403 and _signed_in(client)  # a forced sign-out does nothing
        assert client.post("/dashboard/logout").status_code == 403 and _signed_in(client)
        page_token = dashboard_form_token(client, "/dashboard")  # the sign-out form's own token
        signed_out = client.post("/dashboard/logout", data={"csrf_token": page_token})
        assert signed_out.status_code == 303 and signed_out.headers["location"] == "/dashboard/login"
        assert not _signed_in(client)
    with httpx.Client(base_url=module_gateway.url, timeout=30, cookies={"gw_session": copied}) as replay:
        response = replay.get("/dashboard")
        assert response.status_code == 303 and response.headers["location"] == "/dashboard/login"
        assert replay.get("/api/savings").status_code == 401  # the cookie reads no API either
