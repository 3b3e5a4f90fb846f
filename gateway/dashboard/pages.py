"""The dashboard: savings over time, sessions, the assembly inspector, and the evaluation.

Server-rendered (Jinja2), no script, charts as inline SVG, one stylesheet. Signed in with a
tenant or admin key through a form; the session lives in an HttpOnly cookie
naming a session the database holds (gateway/access/dashboard_sessions.py), never in the URL.
Every form carries a token and refuses posts from other sites
(gateway/dashboard/form_guard.py); every response carries the security headers of
gateway/dashboard/headers.py. Figures come from the same ledger function as
`GET /api/savings`, the evaluation's from the same function as `GET /api/evaluation`
(gateway/api/evaluation.py `evaluation_of`); a tenant's filters list only its own models.
"""
from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from gateway.access.auth import Principal
from gateway.access.dashboard_sessions import COOKIE, LIFETIME_SECONDS, end_session, signed_in, start_session
from gateway.api.evaluation import evaluation_of
from gateway.api.records import savings_ledger
from gateway.dashboard import evaluation_view
from gateway.dashboard import form_guard as guard
from gateway.dashboard.charts import bars
from gateway.errors import AuthenticationFailed, GatewayError
from gateway.ops.logs import note_refusal
from gateway.pipeline.conversation_names import name_runs
from gateway.pipeline.run_recorder import outcomes_written
from gateway.services import Services, ServicesDep
from gateway.threads import aside
from policies.memo import memo

TEMPLATES = Path(__file__).parent / "templates"
router = APIRouter(prefix="/dashboard", include_in_schema=False, dependencies=[Depends(outcomes_written)])
templates = Jinja2Templates(directory=str(TEMPLATES))
_TEXT_PARTS = ("text", "input_text", "output_text")


def _as_text(content: Any) -> str:
    """A message's content as a reader wants it: text as text (a list of text parts joined), anything
    else as indented JSON with its characters as they are (no `\\u0027`); the page escapes it."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in _TEXT_PARTS for p in content):
        return "\n".join(str(p.get("text", "")) for p in content)
    return json.dumps(content, ensure_ascii=False, indent=1)


def _duration(value: timedelta) -> str:
    """A retention lifetime as the config writes it: 90d, 12h, 45m."""
    seconds = int(value.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


templates.env.filters["as_text"] = _as_text
templates.env.filters["duration"] = _duration
templates.env.filters.update(evaluation_view.FILTERS)
templates.env.globals.update(evaluation_view.GLOBALS)


@memo(maxsize=1)  # no arguments: one value
def _stylesheet() -> str:
    return (TEMPLATES / "dashboard.css").read_text(encoding="utf-8")


async def _signed_in(request: Request, services: Services) -> Principal | None:
    return await aside(signed_in, services.store, services.sessions, services.keyring, request.cookies.get(COOKIE),
                       services.clock())


def _login_redirect() -> RedirectResponse:
    return RedirectResponse("/dashboard/login", status_code=303)


def _page(request: Request, services: Services, name: str, context: dict[str, Any], status: int = 200) -> Response:
    """A page whose forms carry the token bound to the browser's `gw_csrf` cookie (set here if new)."""
    cookie, new = guard.form_cookie(request)
    response = templates.TemplateResponse(
        request, name, {**context, "csrf_token": guard.token_for(services.sessions, cookie)}, status_code=status)
    if new:
        guard.keep(response, request, cookie)
    return response


def _bad_filter(request: Request, services: Services, principal: Principal, error: GatewayError) -> Response:
    """A bad filter: said on a page, escaped like every other string."""
    note_refusal(error.code or error.error_type)
    return _page(request, services, "error.html",
                 {"principal": principal, "message": error.message, "status": error.status_code},
                 status=error.status_code)


def _refused(request: Request, services: Services, reason: str) -> Response:
    note_refusal("permission_denied")
    return _page(request, services, "refused.html", {"principal": None, "message": reason}, status=403)


@router.get("/style.css")
async def stylesheet() -> Response:
    return Response(_stylesheet(), media_type="text/css", headers={"cache-control": "max-age=300"})


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, services: ServicesDep) -> Response:
    return _page(request, services, "login.html", {"principal": None, "error": None})


@router.post("/login")
async def login(request: Request, services: ServicesDep, api_key: str = Form(""),
                csrf_token: str = Form("")) -> Response:
    """Sign in with a config key or a made one (`gw-...`); posts from other sites are a 403."""
    reason = guard.refusal(request, services.sessions, csrf_token)
    if reason is not None:
        return _refused(request, services, reason)
    key = api_key.strip()
    try:
        principal = await services.keyring.afind(key) if key else None
    except AuthenticationFailed as error:  # a made key revoked or expired: said as such
        principal, message, code = None, error.message, error.code
    else:
        message, code = "That key is not known here.", "invalid_api_key"
    if principal is None:
        note_refusal(code or "invalid_api_key")
        return _page(request, services, "login.html", {"principal": None, "error": message}, status=401)
    cookie = await aside(start_session, services.store, services.sessions, principal, services.clock())
    response = RedirectResponse("/dashboard", status_code=303)
    response.set_cookie(COOKIE, cookie, max_age=LIFETIME_SECONDS, httponly=True,
                        samesite="strict", secure=request.url.scheme == "https", path="/")
    return response


@router.post("/logout")
async def logout(request: Request, services: ServicesDep, csrf_token: str = Form("")) -> Response:
    """Sign out: the session ends on the server, so a copy of the cookie signs nobody in either."""
    reason = guard.refusal(request, services.sessions, csrf_token)
    if reason is not None:
        return _refused(request, services, reason)
    await aside(end_session, services.store, services.sessions, request.cookies.get(COOKIE), services.clock())
    response = _login_redirect()
    response.delete_cookie(COOKIE, path="/")
    return response


async def _models(services: Services, principal: Principal) -> list[str]:
    """The models the filter offers: every model of the config to an admin; to a tenant the models it
    may use (`tenants[].models`, narrowed by a made key's own list), else those its records name."""
    if principal.is_admin:
        return [m.name for m in services.settings.models]
    if principal.tenant is not None and principal.tenant.models is not None:
        return list(principal.tenant.models)
    return await aside(services.store.models_used, principal.tenant_id)


@router.get("", response_class=HTMLResponse)
async def overview(
    request: Request,
    services: ServicesDep,
    tenant: str | None = None,
    model: str | None = None,
    start: str | None = None,
    end: str | None = None,
) -> Response:
    principal = await _signed_in(request, services)
    if principal is None:
        return _login_redirect()
    try:
        ledger = await savings_ledger(services, principal, start, end, model or None, None, tenant or None)
    except GatewayError as error:
        return _bad_filter(request, services, principal, error)
    scope = ledger["filters"]["tenant"]
    runs = await aside(services.store.recent_runs, scope, 30)
    models = await _models(services, principal)
    await name_runs(services.store, runs)
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
        "tenants": [t.id for t in services.settings.tenants] if principal.is_admin else [],
        "models": models,
        "unpriced": _unpriced(services, models),
    }
    return _page(request, services, "overview.html", context)


@router.get("/evaluation", response_class=HTMLResponse)
async def evaluation(
    request: Request,
    services: ServicesDep,
    tenant: str | None = None,
    model: str | None = None,
    policy_version: str | None = None,
    from_: str | None = Query(None, alias="from"),
    to: str | None = None,
) -> Response:
    """Whether the projection changes what the agents do: the report `GET /api/evaluation` answers for the
    same filters (an empty form field is no filter), drawn."""
    principal = await _signed_in(request, services)
    if principal is None:
        return _login_redirect()
    chosen = {"tenant": tenant or None, "model": model or None, "start": from_ or None, "end": to or None}
    try:
        report = await evaluation_of(services, principal, policy_version=policy_version or None, **chosen)
        versions = report["policy_versions"]
        if policy_version:  # the filter offers every version the other filters see, not only the chosen one
            versions = (await evaluation_of(services, principal, policy_version=None, **chosen))["policy_versions"]
    except GatewayError as error:
        return _bad_filter(request, services, principal, error)
    context: dict[str, Any] = {
        "principal": principal,
        "report": report,
        "filters": report["filters"],
        "signals": report["signals"],
        "versions": sorted(set(versions) | ({policy_version} if policy_version else set())),
        "tenants": [t.id for t in services.settings.tenants] if principal.is_admin else [],
        "models": await _models(services, principal),
    }
    return _page(request, services, "evaluation.html", context)


def _unpriced(services: Services, models: list[str]) -> list[str]:
    """Of the models the page's filter offers (never another tenant's), those without a price: their runs
    show $0 (said on the page)."""
    return sorted(name for name in set(models) if "*" not in name
                  and any(services.upstream.prices(entry.litellm_params) is None
                          for _, entry in services.settings.deployments(name)))


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


_NO_TRANSCRIPT = ("openai.embeddings", "openai.completions")


def _gone(run: dict[str, Any], assembly: dict[str, Any] | None, original: list[dict[str, Any]]) -> list[str]:
    """What of this run's records retention has removed (the run itself outlives them): said on its page."""
    if run["wire_format"] in _NO_TRANSCRIPT or run["status"] == "pending":
        return []
    gone = []
    if assembly is None and run["status"] == "ok":
        gone.append("assemblies")
    if run.get("message_count") and not original:
        gone.append("transcript")
    return gone


@router.get("/requests/{request_id}", response_class=HTMLResponse)
async def inspector(request_id: str, request: Request, services: ServicesDep) -> Response:
    principal = await _signed_in(request, services)
    if principal is None:
        return _login_redirect()
    record = await aside(services.store.get_run, request_id, principal.scope())
    if record is None:  # another tenant's request looks like no request at all
        note_refusal("not_found")
        return _page(request, services, "not_found.html", {"principal": principal}, status=404)
    run = dict(record.run)
    await name_runs(services.store, [run])
    original = await aside(services.store.path_messages, record.run["leaf_node_id"])
    forwarded = await aside(services.store.forwarded_messages, request_id, principal.scope())
    assembly = record.assembly.as_dict() if record.assembly else None
    decisions = assembly["decisions"] if assembly else []
    context = {
        "principal": principal,
        "run": run,
        "assembly": assembly,
        "rows": _rows(original, forwarded, decisions),
        "rehydrations": [d for d in decisions if d.get("index") is None],
        "decision_counts": dict(Counter(d["action"] for d in decisions)),
        "gone": _gone(record.run, assembly, original),
        "retention": services.settings.retention_for(record.run["tenant"]),
    }
    return _page(request, services, "request.html", context)
