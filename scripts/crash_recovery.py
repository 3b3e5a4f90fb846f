"""Kill the gateway with SIGKILL during a replayed agent trace, start it again, and check nothing was lost.

    .venv/bin/python scripts/crash_recovery.py [--kills 5] [--trace NAME] [--seed N] [--json]

On PostgreSQL (GATEWAY_TEST_POSTGRES_URL, a fresh schema per run), with the
fake upstream answering each request after a delay so that kills land inside
requests. The trace is replayed turn by turn, as the agent sends it; at
`--kills` random turns the gateway process group is killed while the request
is in flight, started again, and the agent sends the same turn again. Then:
- no run is left `pending` (the dead instances' runs are settled `interrupted`);
- every tool result of the trace is served byte-exact from /api/artifacts;
- the last request's projection equals the one an uninterrupted gateway forwarded
  for the same trace (a second run on its own schema, no kills).
Exits 1 if any check fails.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies.transcript import artifact_id_for, message_path  # noqa: E402
from scripts.processes import (  # noqa: E402
    TENANT_KEY, Gateway, print_report, fake_upstream, free_port, load_trace, postgres_schema, trace_turns, write_config,
)

LABEL = "crash-recovery"


def send(gateway: Gateway, messages: list[dict[str, Any]], tools: list[dict[str, Any]], stream: bool) -> str:
    """One agent turn; returns the request id."""
    body: dict[str, Any] = {"model": "fake", "messages": messages, "stream": stream}
    if tools:
        body["tools"] = tools
    headers = {"Authorization": f"Bearer {TENANT_KEY}", "x-gateway-session": LABEL}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    if response.status_code != 200 or (stream and "[DONE]" not in response.text):
        raise RuntimeError(f"turn of {len(messages)} messages: {response.status_code} {response.text[:300]}")
    return response.headers["x-gateway-request-id"]


def replay(gateway: Gateway, trace: dict[str, Any], kill_at: set[int], rng: random.Random,
           delay: float) -> tuple[str, int]:
    """Replay the trace; kill the gateway inside the turns in `kill_at`. (last request id, kills that landed)."""
    messages, tools = trace["messages"], trace.get("tools") or []
    last = ""
    landed = 0
    for number, end in enumerate(trace_turns(messages)):
        stream = number % 2 == 1
        if number in kill_at:
            outcome: dict[str, Any] = {}

            def doomed() -> None:
                try:
                    outcome["id"] = send(gateway, messages[:end], tools, stream)
                except Exception as exc:  # the connection dies with the process
                    outcome["error"] = exc

            thread = threading.Thread(target=doomed)
            thread.start()
            time.sleep(rng.uniform(0.002, delay + 0.03))
            gateway.kill()
            thread.join(30)
            landed += "error" in outcome
            gateway.start()
        last = send(gateway, messages[:end], tools, stream)  # the agent (re)sends the turn
    return last, landed


def projection(gateway: Gateway, request_id: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{gateway.url}/api/requests/{request_id}/projection",
                         headers={"Authorization": f"Bearer {TENANT_KEY}"}, timeout=30)
    response.raise_for_status()
    return response.json()["messages"]


def pending_and_statuses(url: str) -> dict[str, int]:
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT status, count(*) FROM model_runs GROUP BY status")).all()
    engine.dispose()
    return {status: count for status, count in rows}


def check_artifacts(gateway: Gateway, trace: dict[str, Any]) -> tuple[int, list[str]]:
    messages = trace["messages"]
    path = message_path("acme", messages)
    checked, bad = 0, []
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {TENANT_KEY}"}, timeout=30) as http:
        for node, message in zip(path, messages):
            if message.get("role") != "tool":
                continue
            artifact = artifact_id_for(node.id)
            response = http.get(f"/api/artifacts/{artifact}")
            checked += 1
            if response.status_code != 200 or response.content != str(message.get("content") or "").encode():
                bad.append(f"{artifact}: {response.status_code}")
    return checked, bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--trace", default="openhands_codeact_llama4-maverick_ponyc-4593.jsonl")
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.2, help="seconds the upstream takes per answer")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    trace = load_trace(args.trace)
    turns = trace_turns(trace["messages"])
    kill_at = set(rng.sample(range(1, len(turns)), min(args.kills, len(turns) - 1)))
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, fake_upstream(delay=args.delay) as upstream, \
            postgres_schema() as crash_url, postgres_schema() as clean_url:
        folder = Path(tmp)
        (folder / "clean").mkdir()
        (folder / "crash").mkdir()
        clean = Gateway(write_config(folder / "clean", clean_url, upstream), free_port(), folder / "clean.log").start()
        try:
            clean_last, _ = replay(clean, trace, set(), rng, args.delay)
            expected = projection(clean, clean_last)
        finally:
            clean.stop()
        config = write_config(folder / "crash", crash_url, upstream)
        gateway = Gateway(config, free_port(), folder / "crash.log").start()
        try:
            last, landed = replay(gateway, trace, kill_at, rng, args.delay)
            deadline = time.monotonic() + 20  # dead instances are settled after three missed beats
            statuses = pending_and_statuses(crash_url)
            while statuses.get("pending") and time.monotonic() < deadline:
                time.sleep(0.25)
                statuses = pending_and_statuses(crash_url)
            checked, bad = check_artifacts(gateway, trace)
            same = projection(gateway, last) == expected
        finally:
            gateway.stop()
    report = {
        "trace": args.trace, "turns": len(turns), "kills": len(kill_at), "kills_inside_a_request": landed,
        "runs_by_status": statuses, "pending": statuses.get("pending", 0), "artifacts_checked": checked,
        "artifacts_not_byte_exact": bad, "final_projection_equals_uninterrupted": same,
        "seconds": round(time.monotonic() - started, 1),
    }
    ok = report["pending"] == 0 and not bad and same and checked > 0
    return print_report(report, ok, args.json)


if __name__ == "__main__":
    sys.exit(main())
