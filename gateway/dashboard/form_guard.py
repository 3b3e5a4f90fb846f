"""The dashboard's forms refuse posts made by other sites (login CSRF, forced sign-out).

Three checks, any of which refuses:

- `Sec-Fetch-Site`, when the browser sends it, must be `same-origin` (or
  `none`: the user's own action). Another port or a sibling subdomain is
  `same-site`, which SameSite cookies do not stop, and is refused here.
- `Origin`, when sent, must be the gateway's own origin: the scheme and host
  the request came to, or those a proxy in front names in
  `X-Forwarded-Proto` / `X-Forwarded-Host` (a cross-site form cannot set
  those). `Origin: null` (a sandboxed frame, a data: page) is refused.
- The form's `csrf_token` must be the HMAC of the `gw_csrf` cookie (a
  random value, HttpOnly, SameSite=Strict, set with the first page). A page
  elsewhere can neither read the cookie nor compute the token, so this covers
  a browser that sends neither header.

Every page keeps `Referrer-Policy: same-origin` (gateway/dashboard/headers.py), under which a
browser sends `Origin` on the dashboard's own posts (`no-referrer` would make it `null`).
"""
from __future__ import annotations

import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

from gateway.access.dashboard_sessions import LIFETIME_SECONDS, SessionSigner

CSRF_COOKIE = "gw_csrf"
FIELD = "csrf_token"
_SAME = ("same-origin", "none")


def _first(value: str | None) -> str | None:
    return value.split(",")[0].strip().lower() or None if value else None


def own_origins(request: Request) -> set[str]:
    """The origins this request may have been posted from: the URL it reached, and the one a proxy names."""
    origins = {f"{request.url.scheme}://{request.url.netloc}".lower()}
    proto = _first(request.headers.get("x-forwarded-proto")) or request.url.scheme
    host = _first(request.headers.get("x-forwarded-host")) or request.url.netloc.lower()
    origins.add(f"{proto}://{host}")
    for origin in list(origins):  # the default port may be named or not
        for scheme, port in (("http", ":80"), ("https", ":443")):
            if origin.startswith(f"{scheme}://") and origin.endswith(port):
                origins.add(origin[: -len(port)])
    return origins


def cross_site(request: Request) -> str | None:
    """Why the browser's own headers say this post came from elsewhere; None if they do not."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site.lower() not in _SAME:
        return f"your browser says this form was sent from another site (Sec-Fetch-Site: {site})."
    origin = request.headers.get("origin")
    if origin is not None and origin.lower().rstrip("/") not in own_origins(request):
        return f"it was sent from {origin}, not from this gateway's own pages."
    return None


def token_for(signer: SessionSigner, cookie: str) -> str:
    return signer.mac("csrf", cookie)


def refusal(request: Request, signer: SessionSigner, token: str) -> str | None:
    """Why a dashboard post is refused (a sentence for the 403 page); None to go ahead."""
    reason = cross_site(request)
    if reason is not None:
        return f"This form was refused: {reason}"
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie or not token or not hmac.compare_digest(token, token_for(signer, cookie)):
        return ("This form was refused: it did not carry this gateway's form token (the page may be old, "
                "cookies may be blocked, or it came from another site). Open the page again and retry.")
    return None


def form_cookie(request: Request) -> tuple[str, bool]:
    """The `gw_csrf` value the page's forms are bound to, and whether it is new (then `keep` sets it)."""
    cookie = request.cookies.get(CSRF_COOKIE)
    if cookie and 20 <= len(cookie) <= 100:
        return cookie, False
    return secrets.token_urlsafe(32), True


def keep(response: Response, request: Request, cookie: str) -> None:
    response.set_cookie(CSRF_COOKIE, cookie, max_age=LIFETIME_SECONDS, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/dashboard")
