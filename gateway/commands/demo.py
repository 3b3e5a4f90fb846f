"""`gateway demo`: a real agent session through a running gateway, so a first run shows the point.

The bundled trace (gateway/demo/, a real OpenHands run with 23 tool calls) is sent as its agent sent
it: request i holds the transcript up to the i-th answer, the whole of it, every time. The gateway
captures each tool result, forwards its projection to the model (the offline `demo` model of
config.example.yaml by default), and records what it saved; the dashboard then shows real savings.
The answers the model gives are not used: the transcript's own answers are the next request's.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, Callable

import httpx

from gateway.commands.replay import trace_turns

TRACE = "openhands_codeact_llama4-maverick_ponyc-4595.jsonl"


@dataclass(frozen=True)
class DemoResult:
    session: str
    requests: int
    tokens_sent: int
    tokens_forwarded: int
    saved_usd: float
    cost_original_usd: float


def bundled_trace() -> dict[str, Any]:
    return json.loads(files("gateway").joinpath("demo", TRACE).read_text(encoding="utf-8").splitlines()[0])


class DemoFailed(RuntimeError):
    """The gateway refused or failed a request of the demo: said in one line."""


def run_demo(url: str, key: str, model: str, say: Callable[[str], None] = print,
             client: httpx.Client | None = None) -> DemoResult:
    trace = bundled_trace()
    messages, turns = trace_turns(trace)
    session = f"demo-ponyc-4595-{int(time.time())}"
    headers = {"authorization": f"Bearer {key}", "x-gateway-session": session}
    http = client or httpx.Client(base_url=url, timeout=120)
    try:
        for number, i in enumerate(turns, 1):
            try:
                answer = http.post("/v1/chat/completions", headers=headers,
                                   json={"model": model, "messages": messages[:i], "tools": trace["tools"]})
            except httpx.HTTPError as exc:
                raise DemoFailed(f"cannot reach the gateway at {url}: {exc}") from exc
            if answer.status_code != 200:
                raise DemoFailed(f"request {number} answered {answer.status_code}: {_error_message(answer)}")
            say(f"request {number:>2}/{len(turns)}: {i:>2} messages, "
                f"{int(answer.headers.get('x-gateway-tokens-original', 0)):>6} tokens sent, "
                f"{int(answer.headers.get('x-gateway-tokens-forwarded', 0)):>6} forwarded")
        ledger = http.get("/api/savings", headers=headers, params={"session": session})
    finally:
        if client is None:
            http.close()
    if ledger.status_code != 200:
        raise DemoFailed(f"GET /api/savings answered {ledger.status_code}: {_error_message(ledger)}")
    totals = ledger.json()["totals"]
    return DemoResult(session=session, requests=len(turns), tokens_sent=totals["tokens_sent"],
                      tokens_forwarded=totals["tokens_forwarded"], saved_usd=totals["saved_usd"],
                      cost_original_usd=totals["cost_original_usd"])


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
    except ValueError:
        return response.text[:200]
    return str(error.get("message") if isinstance(error, dict) else error)[:300]
