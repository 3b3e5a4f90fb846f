"""Security headers on every dashboard response (plain ASGI; its place in the stack is in gateway/app.py).

The pages run no script and load nothing from elsewhere: one stylesheet from
the gateway itself (`/dashboard/style.css`), inline SVG charts (presentation
attributes, which a CSP does not govern), forms that post to the gateway. So
the policy allows exactly that, and no page can be framed (`frame-ancestors
'none'`, and `X-Frame-Options: DENY` for browsers without CSP level 2).
`Referrer-Policy: same-origin` keeps the pages' URLs (tenant, filters) to the
gateway while keeping the `Origin` header on the dashboard's own posts, which
gateway/dashboard/form_guard.py checks. Pages are `no-store`, so the back button
after signing out does not show a tenant's figures from the cache.
`X-Content-Type-Options: nosniff` is on every response of the gateway already (gateway/edge/request_id.py).
"""
from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                           "frame-ancestors 'none'; base-uri 'none'")
HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
_OURS = {name for name, _ in HEADERS}


def is_dashboard(path: str) -> bool:
    return path == "/dashboard" or path.startswith("/dashboard/")


class DashboardHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_dashboard(scope.get("path", "")):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(n, v) for n, v in message.get("headers", ()) if n.lower() not in _OURS]
                if not any(n.lower() == b"cache-control" for n, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers + list(HEADERS)}
            await send(message)

        await self.app(scope, receive, with_headers)
