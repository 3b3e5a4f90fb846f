"""The dashboard: savings over time, sessions, and the assembly inspector.

Server-rendered (Jinja2), no script, charts as inline SVG. Signed in with a
tenant or admin key through a form; the session lives in an HttpOnly cookie
(gateway/sessions.py), never in the URL. Figures come from the same ledger
function as `GET /api/savings`.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from gateway.auth import Principal
from gateway.charts import bars
from gateway.errors import GatewayError
from gateway.records_api import savings_ledger
from gateway.run_recorder import outcomes_written
from gateway.services import Services, ServicesDep
from gateway.sessions import COOKIE, LIFETIME_SECONDS
from gateway.threads import aside

router = APIRouter(prefix="/dashboard", include_in_schema=False, dependencies=[Depends(outcomes_written)])
templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))


def _signed_in(request: Request, services: Services) -> Principal | None:
    return services.sessions.verify(request.cookies.get(COOKIE), services.keyring)


def _login_redirect() -> RedirectResponse:
    return RedirectResponse("/dashboard/login", status_code=303)


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request) -> Response:
    return templates.TemplateResponse(request, "login.html", {"principal": None, "error": None})


@router.post("/login")
async def login(request: Request, services: ServicesDep, api_key: str = Form("")) -> Response:
    principal = services.keyring.lookup(api_key.strip()) if api_key.strip() else None
    if principal is None:
        return templates.TemplateResponse(
            request, "login.html", {"principal": None, "error": "That key is not known here."}, status_code=401
        )
    response = RedirectResponse("/dashboard", status_code=303)
    response.set_cookie(COOKIE, services.sessions.issue(principal), max_age=LIFETIME_SECONDS, httponly=True,
                        samesite="strict", secure=request.url.scheme == "https", path="/")
    return response


@router.post("/logout")
async def logout() -> Response:
    response = RedirectResponse("/dashboard/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


@router.get("", response_class=HTMLResponse)
async def overview(
    request: Request,
    services: ServicesDep,
    tenant: str | None = None,
    model: str | None = None,
    start: str | None = None,
    end: str | None = None,
) -> Response:
    principal = _signed_in(request, services)
    if principal is None:
        return _login_redirect()
    try:
        ledger = await savings_ledger(services, principal, start, end, model or None, None, tenant or None)
    except GatewayError as error:  # a bad filter: said on a page, escaped like every other string
        return templates.TemplateResponse(request, "error.html", {"principal": principal, "message": error.message,
                                                                  "status": error.status_code},
                                          status_code=error.status_code)
    scope = ledger["filters"]["tenant"]
    runs = await aside(services.store.recent_runs, scope, 30)
    days = [d["day"] for d in ledger["by_day"]]
    token_chart = bars(days, [("tokens sent", "var(--sent)", [d["tokens_sent"] for d in ledger["by_day"]]),
                              ("tokens forwarded", "var(--fwd)", [d["tokens_forwarded"] for d in ledger["by_day"]])],
                       "Tokens sent by clients and forwarded upstream, per day")
    money_chart = bars(days, [("saved USD", "var(--saved)", [max(0.0, d["saved_usd"]) for d in ledger["by_day"]])],
                       "Money saved per day (USD)")
    context: dict[str, Any] = {
        "principal": principal,
        "ledger": ledger,
        "filters": ledger["filters"],
        "runs": runs,
        "token_chart": token_chart,
        "money_chart": money_chart,
        "tenants": [t.id for t in services.settings.tenants],
        "models": [m.name for m in services.settings.models],
    }
    return templates.TemplateResponse(request, "overview.html", context)


def _rows(original: list[dict[str, Any]], forwarded: list[dict[str, Any]] | None,
          decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Side by side: each client message, its decision, and what was forwarded in its place."""
    by_index = {d["index"]: d for d in decisions if d.get("index") is not None}
    remaining = list(forwarded or [])
    rows = []
    for index, message in enumerate(original):
        decision = by_index.get(index, {"action": "verbatim", "reason": "kept"})
        sent = None
        if decision["action"] != "omitted" and remaining:
            sent = remaining.pop(0)
        rows.append({"index": index, "original": message, "forwarded": sent, "decision": decision,
                     "artifact_id": message.get("artifact_id") or decision.get("artifact_id")})
    return rows


@router.get("/requests/{request_id}", response_class=HTMLResponse)
async def inspector(request_id: str, request: Request, services: ServicesDep) -> Response:
    principal = _signed_in(request, services)
    if principal is None:
        return _login_redirect()
    record = await aside(services.store.get_run, request_id, principal.scope())
    if record is None:  # another tenant's request looks like no request at all
        return templates.TemplateResponse(request, "not_found.html", {"principal": principal}, status_code=404)
    original = await aside(services.store.path_messages, record.run["leaf_node_id"])
    forwarded = await aside(services.store.forwarded_messages, request_id, principal.scope())
    assembly = record.assembly.as_dict() if record.assembly else None
    decisions = assembly["decisions"] if assembly else []
    context = {
        "principal": principal,
        "run": record.run,
        "assembly": assembly,
        "rows": _rows(original, forwarded, decisions),
        "rehydrations": [d for d in decisions if d.get("index") is None],
        "decision_counts": dict(Counter(d["action"] for d in decisions)),
    }
    return templates.TemplateResponse(request, "request.html", context)
