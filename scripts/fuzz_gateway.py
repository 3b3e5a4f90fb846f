"""A fuzz campaign against a running gateway on PostgreSQL: malformed and hostile requests by the thousand.

    .venv/bin/python scripts/fuzz_gateway.py [--requests 10000] [--workers 8] [--seed N] [--json]

Starts the fake upstream and `gateway serve` (PostgreSQL: a fresh schema on
GATEWAY_TEST_POSTGRES_URL), seeds two tenants with real traffic (a replayed
trace for acme, a conversation for globex), then sends `--requests` requests
made by mutating valid ones: broken JSON, wrong types anywhere, NaN and
Infinity, lone surrogates, deep nesting, NUL in ids, headers, paths and query
parameters, orphan tool messages, oversized bodies, bad keys, foreign and
made-up ids on every read route, another tenant's records. Every worker keeps
one keep-alive connection. It reports, and fails on:
- any 5xx;
- an error body outside the caller's shape (OpenAI's `{"error": {message, type, param, code}}`);
- a keep-alive connection that died without the server saying `Connection: close`;
- another tenant's record served or deleted (a 2xx, or its bytes in any answer);
- a run left `pending`, or a seeded artifact that is no longer byte-exact.
"""
from __future__ import annotations

import argparse
import collections
import http.client
import json
import random
import string
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import sqlalchemy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.format_replay import to_anthropic, to_responses  # noqa: E402
from policies.transcript import artifact_id_for, message_path  # noqa: E402
from scripts.processes import (  # noqa: E402
    ADMIN_KEY, OTHER_KEY, TENANT_KEY, Gateway, fake_upstream, free_port, load_trace, postgres_schema, print_report,
    trace_turns,
    write_config,
)

MAX_BODY = 2 * 1024 * 1024
JUNK_VALUES: list[Any] = [None, True, False, 0, -1, 10**30, 1.5e308, "", "x", " ", "\u00e9\u4e2d", [], {}, [1, "a"],
                          {"a": {"b": [None]}}, "a" * 300, -0.0]
ROUTES_GET = ["/api/artifacts/{art}", "/api/artifacts/{art}/metadata", "/api/artifacts/{args}",
              "/api/requests/{req}", "/api/requests/{req}/projection", "/api/savings", "/v1/models", "/healthz",
              "/readyz", "/dashboard", "/dashboard/requests/{req}", "/metrics", "/v1/nothing-here", "/docs"]


@dataclass
class Seeds:
    acme_artifacts: dict[str, bytes] = field(default_factory=dict)  # id -> raw bytes
    acme_requests: list[str] = field(default_factory=list)
    globex_artifacts: list[str] = field(default_factory=list)
    globex_requests: list[str] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)  # valid chat bodies to mutate
    messages_bodies: list[dict[str, Any]] = field(default_factory=list)  # the same turns, Anthropic Messages
    responses_bodies: list[dict[str, Any]] = field(default_factory=list)  # the same turns, Responses


@dataclass
class Findings:
    statuses: collections.Counter = field(default_factory=collections.Counter)
    server_errors: list[str] = field(default_factory=list)
    bad_shapes: list[str] = field(default_factory=list)
    dead_keepalive: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: list[str], what: str) -> None:
        with self.lock:
            if len(kind) < 10_000:
                kind.append(what)


# --- seeding ---------------------------------------------------------------

def seed(gateway: Gateway) -> Seeds:
    seeds = Seeds()
    trace = load_trace("sweagent_demo_ctf_rev_rock.jsonl")
    messages, tools = trace["messages"], trace.get("tools") or []
    with httpx.Client(base_url=gateway.url, timeout=60) as client:
        for end in trace_turns(messages):
            body = {"model": "fake", "messages": messages[:end], **({"tools": tools} if tools else {})}
            response = client.post("/v1/chat/completions", json=body,
                                   headers={"Authorization": f"Bearer {TENANT_KEY}", "x-gateway-session": "seed-acme"})
            response.raise_for_status()
            seeds.acme_requests.append(response.headers["x-gateway-request-id"])
            seeds.bodies.append(body)
            system, converted = to_anthropic(messages[:end])
            seeds.messages_bodies.append({"model": "claude-sonnet-4-5", "max_tokens": 256, "messages": converted,
                                          **({"system": system} if system else {})})
            instructions, items = to_responses(messages[:end])
            seeds.responses_bodies.append({"model": "fake", "input": items,
                                           **({"instructions": instructions} if instructions else {})})
        for node, message in zip(message_path("acme", messages), messages):
            if message.get("role") == "tool":
                seeds.acme_artifacts[artifact_id_for(node.id)] = str(message.get("content") or "").encode()
        globex = [{"role": "user", "content": "List the files."},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "g1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "g1", "content": "secret-globex-file.txt\n" * 200}]
        response = client.post("/v1/chat/completions", json={"model": "fake", "messages": globex},
                               headers={"Authorization": f"Bearer {OTHER_KEY}", "x-gateway-session": "seed-globex"})
        response.raise_for_status()
        seeds.globex_requests.append(response.headers["x-gateway-request-id"])
        record = client.get(f"/api/requests/{seeds.globex_requests[0]}",
                            headers={"Authorization": f"Bearer {OTHER_KEY}"}).json()
        seeds.globex_artifacts = list(record["captured_artifact_ids"])
    return seeds


# --- mutations ---------------------------------------------------------------

def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


def _set(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _set(copy[head], rest, new)
    return copy


def _delete(value: Any, path: tuple) -> Any:
    if len(path) == 1:
        copy = dict(value) if isinstance(value, dict) else list(value)
        del copy[path[0]]
        return copy
    head = path[0]
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _delete(copy[head], path[1:])
    return copy


def _junk(rng: random.Random) -> Any:
    choice = rng.random()
    if choice < 0.6:
        return rng.choice(JUNK_VALUES)
    if choice < 0.8:
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 40)))
    nested: Any = rng.choice(JUNK_VALUES)
    for _ in range(rng.randint(1, 40)):
        nested = [nested] if rng.random() < 0.5 else {"k": nested}
    return nested


def mutate_body(rng: random.Random, body: dict[str, Any]) -> bytes:
    """A valid chat body made invalid (or odd) in one to three ways; returned as raw bytes."""
    value: Any = json.loads(json.dumps(body))
    for _ in range(rng.randint(1, 3)):
        paths = _paths(value)
        path = rng.choice(paths)
        kind = rng.random()
        if kind < 0.35:
            value = _set(value, path, _junk(rng))
        elif kind < 0.5 and path:
            value = _delete(value, path)
        elif kind < 0.6:
            value = _set(value, path, "id\x00with-nul") if path else value
        elif kind < 0.7 and isinstance(value, dict) and isinstance(value.get("messages"), list) and value["messages"]:
            messages = list(value["messages"])
            op = rng.random()
            if op < 0.3:
                rng.shuffle(messages)
            elif op < 0.6:
                messages.insert(rng.randrange(len(messages) + 1),
                                {"role": "tool", "tool_call_id": rng.choice(["call_1", "nope", ""]), "content": "r"})
            else:
                messages.append(rng.choice(messages))
            value["messages"] = messages
        elif kind < 0.8 and isinstance(value, dict):
            value[rng.choice(["stream", "n", "tools", "tool_choice", "stream_options", "temperature", "max_tokens",
                              "stop", "response_format", "metadata", "user", "model"])] = _junk(rng)
        else:
            value = _set(value, path, rng.choice([[], {}, "", 0])) if path else value
    raw = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    return _raw_damage(rng, raw) if rng.random() < 0.35 else raw


def _raw_damage(rng: random.Random, raw: bytes) -> bytes:
    kind = rng.randrange(9)
    if kind == 0:
        return raw[: rng.randrange(len(raw) + 1)]  # truncated
    if kind == 1:  # a lone surrogate escape inside some string
        spot = raw.find(b'"content": "')
        escape = rng.choice([b"\\ud800", b"\\udfff", b"\\udc00x", b"\\ud83d"])
        return raw[: spot + 12] + escape + raw[spot + 12:] if spot >= 0 else raw + escape
    if kind == 2:
        return raw.replace(b"}", b', "temperature": ' + rng.choice([b"NaN", b"Infinity", b"-Infinity"]) + b"}", 1)
    if kind == 3:
        depth = rng.choice([50, 65, 500, 3000, 20000])
        return raw[:-1] + b', "metadata": ' + b"[" * depth + b"]" * depth + b"}"
    if kind == 4:
        return raw.replace(b'"', b"\xff", 1) if rng.random() < 0.5 else b"\xef\xbb\xbf" + raw
    if kind == 5:
        return rng.choice([b"", b"null", b"[]", b"42", b'"text"', b"{", b"{}", b"\x00" * 10])
    if kind == 6:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 200)))
    if kind == 7:
        return raw.replace(b'"model": "fake"', b'"model": "fake", "model": ["x"]', 1)
    return raw[:-1] + b', "content": "' + b"A" * rng.choice([10, 100_000, MAX_BODY]) + b'"}'


# --- requests ----------------------------------------------------------------

@dataclass
class Call:
    method: str
    path: str
    headers: dict[str, str | bytes]
    body: bytes | None = None
    foreign: bool = False  # names another tenant's record: a 2xx is a leak


def _auth(rng: random.Random) -> dict[str, str | bytes]:
    roll = rng.random()
    if roll < 0.75:
        return {"Authorization": f"Bearer {TENANT_KEY}"}
    return rng.choice([{}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic abc"},
                       {"x-api-key": TENANT_KEY}, {"Authorization": f"Bearer {ADMIN_KEY}"},
                       {"Authorization": "Bearer " + "k" * 5000}, {"Authorization": b"Bearer \xff\xfe"},
                       {"Authorization": f"Bearer {OTHER_KEY}"}])


def _gateway_headers(rng: random.Random, seeds: Seeds) -> dict[str, str | bytes]:
    headers: dict[str, str | bytes] = {}
    if rng.random() < 0.3:
        headers["x-gateway-session"] = rng.choice(["", " ", "s" * 300, "ticket-1", b"\xe9\xff", "a\tb", "<script>"])
    if rng.random() < 0.2:
        headers["x-gateway-parent-request"] = rng.choice(
            ["req_" + "0" * 32, "nope", "", *seeds.globex_requests, *seeds.acme_requests[:2], "req_" + "g" * 32])
    if rng.random() < 0.2:
        headers["x-gateway-participant"] = rng.choice(["", "p" * 400, "agent-a", b"\xc3\xa9"])
    if rng.random() < 0.1:
        headers["Content-Type"] = rng.choice(["text/plain", "application/x-www-form-urlencoded", "garbage"])
    return headers


def _id(rng: random.Random, seeds: Seeds, kind: str) -> tuple[str, bool]:
    """(an id for a read route, whether it is another tenant's)."""
    roll = rng.random()
    if roll < 0.25 and kind == "art" and seeds.globex_artifacts:
        return rng.choice(seeds.globex_artifacts), True
    if roll < 0.25 and kind == "req":
        return rng.choice(seeds.globex_requests), True
    if roll < 0.45:
        own = list(seeds.acme_artifacts) if kind == "art" else seeds.acme_requests
        return rng.choice(own), False
    return rng.choice(["%00", "art_%00", "%ff%fe", "x" * 3000, "..%2F..%2Fetc%2Fpasswd", "art_" + "0" * 20,
                       "args_" + "f" * 32, "req_" + "1" * 32, "%E2%80%AE", "-1", "%20", "art_%C3%A9",
                       quote("<script>alert(1)</script>", safe="")]), False


def make_call(rng: random.Random, seeds: Seeds) -> Call:
    roll = rng.random()
    if roll < 0.2:  # the other wire formats, malformed or not
        path, pool = rng.choice([("/v1/messages", seeds.messages_bodies), ("/v1/responses", seeds.responses_bodies)])
        body = rng.choice(pool)
        if rng.random() < 0.25:
            sound = json.loads(json.dumps(body))
            sound["stream"] = rng.random() < 0.5
            raw = json.dumps(sound).encode()
        else:
            raw = mutate_body(rng, body)
        auth = {"x-api-key": TENANT_KEY} if rng.random() < 0.5 else _auth(rng)
        return Call("POST", path, {**auth, **_gateway_headers(rng, seeds), "Content-Type": "application/json"}, raw)
    if roll < 0.55:  # a malformed model request
        body = mutate_body(rng, rng.choice(seeds.bodies))
        return Call("POST", rng.choice(["/v1/chat/completions", "/chat/completions"]),
                    {**_auth(rng), **_gateway_headers(rng, seeds), "Content-Type": "application/json"}, body)
    if roll < 0.65:  # a well-formed one, maybe streamed, maybe with hostile headers
        body = json.loads(json.dumps(rng.choice(seeds.bodies)))
        body["stream"] = rng.random() < 0.5
        if body["stream"] and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
        return Call("POST", "/v1/chat/completions", {**_auth(rng), **_gateway_headers(rng, seeds)},
                    json.dumps(body).encode())
    if roll < 0.9:  # a read route with a made-up, own or foreign id, and junk query parameters
        template = rng.choice(ROUTES_GET)
        foreign = False
        path = template
        for kind in ("art", "args", "req"):
            if "{" + kind + "}" in path:
                value, foreign = _id(rng, seeds, "art" if kind != "req" else "req")
                if kind == "args":
                    value = "args_" + value.removeprefix("art_")
                path = path.replace("{" + kind + "}", value)
        if rng.random() < 0.5:
            params = {name: rng.choice(["2026-01-01", "2026-13-45", "%00", "<script>", "x" * 500, "globex", "acme",
                                        "fake", "%ff", ""])
                      for name in rng.sample(["start", "end", "model", "session", "tenant", "%00"], rng.randint(1, 3))}
            path += "?" + "&".join(f"{k}={v}" for k, v in params.items())
        auth = {"Authorization": f"Bearer {TENANT_KEY}"} if rng.random() < 0.8 else _auth(rng)
        return Call("GET", path, auth, foreign=foreign and auth.get("Authorization") == f"Bearer {TENANT_KEY}")
    if roll < 0.95:  # deletions: never acme's seeded conversation; globex's as acme must be a 404
        target = rng.choice(["seed-globex", *seeds.globex_requests, "%00", "x" * 2000, "nope", "conv_" + "0" * 32])
        suffix = rng.choice(["", "?tenant=globex", "?tenant=%00"])
        key = rng.choice([TENANT_KEY, ADMIN_KEY, "sk-wrong"]) if "globex" not in target else TENANT_KEY
        return Call("DELETE", f"/api/sessions/{target}{suffix}", {"Authorization": f"Bearer {key}"},
                    foreign=key == TENANT_KEY and target == "seed-globex")
    method = rng.choice(["PUT", "PATCH", "DELETE", "OPTIONS", "GET"])  # wrong methods on model routes
    return Call(method, rng.choice(["/v1/chat/completions", "/v1/models", "/api/savings"]), _auth(rng),
                b"{}" if method in ("PUT", "PATCH") else None)


# --- running -----------------------------------------------------------------

def _check(call: Call, status: int, headers: http.client.HTTPMessage, payload: bytes, findings: Findings) -> None:
    where = f"{call.method} {call.path[:120]} -> {status}"
    with findings.lock:
        findings.statuses[status] += 1
    if status >= 500:
        findings.add(findings.server_errors, f"{where}: {payload[:200]!r}")
    reader = call.headers.get("Authorization")
    if (call.foreign and 200 <= status < 300) or (b"secret-globex-file" in payload and reader not in (
            f"Bearer {OTHER_KEY}", f"Bearer {ADMIN_KEY}")):  # an admin key reads every tenant: no leak
        findings.add(findings.leaks, f"{where} as {str(reader)[:30]}: {payload[:120]!r}")
    content_type = headers.get("content-type", "")
    anthropic = call.path.startswith(("/v1/messages", "/messages"))
    if status >= 400 and not (call.path.startswith("/dashboard") and "text/html" in content_type):
        try:
            _check_error(json.loads(payload), anthropic)
        except Exception:
            findings.add(findings.bad_shapes, f"{where}: {content_type} {payload[:200]!r}")
    if status == 200 and "text/event-stream" in content_type:
        for line in payload.decode("utf-8", "replace").split("\n"):
            if line.startswith("data: {") and '"error"' in line[:30]:
                try:
                    event = json.loads(line[6:])
                    if call.path.startswith("/v1/responses"):
                        assert event["type"] == "error" and isinstance(event["message"], str) and "code" in event
                    else:
                        _check_error(event, anthropic)
                except Exception:
                    findings.add(findings.bad_shapes, f"{where}: stream error event {line[:200]}")


def _check_error(body: dict[str, Any], anthropic: bool) -> None:
    """OpenAI's error shape, or Anthropic's under /v1/messages."""
    if anthropic:
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        return
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)


def worker(port: int, calls: list[Call], findings: Findings) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    reusable = False  # the previous response on this connection promised keep-alive
    for call in calls:
        try:
            connection.putrequest(call.method, call.path, skip_accept_encoding=True)
            for name, value in call.headers.items():
                connection.putheader(name, value)
            body = call.body or b""
            if call.body is not None:
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body if call.body is not None else None)
            response = connection.getresponse()
            payload = response.read()
        except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine, OSError) as exc:
            if reusable:
                findings.add(findings.dead_keepalive, f"{call.method} {call.path[:80]}: {type(exc).__name__}")
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            reusable = False
            continue
        _check(call, response.status, response.headers, payload, findings)
        reusable = not response.will_close
        if response.will_close:
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.close()


def check_after(gateway: Gateway, storage_url: str, seeds: Seeds) -> tuple[dict[str, int], int, list[str]]:
    engine = sqlalchemy.create_engine(storage_url)
    deadline = time.monotonic() + 10
    while True:
        with engine.connect() as conn:
            query = sqlalchemy.text("SELECT status, count(*) FROM model_runs GROUP BY status")
            statuses = dict(conn.execute(query).all())
        if not statuses.get("pending") or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    engine.dispose()
    bad = []
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {TENANT_KEY}"}, timeout=30) as client:
        for artifact, raw in seeds.acme_artifacts.items():
            response = client.get(f"/api/artifacts/{artifact}")
            if response.status_code != 200 or response.content != raw:
                bad.append(f"{artifact}: {response.status_code}")
    return statuses, len(seeds.acme_artifacts), bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--log", type=Path, help="keep the gateway's log here (tracebacks of any 5xx)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, fake_upstream() as upstream, postgres_schema() as storage_url:
        config = write_config(Path(tmp), storage_url, upstream, max_body_bytes=MAX_BODY)
        gateway = Gateway(config, free_port(), args.log or Path(tmp) / "gateway.log").start()
        try:
            seeds = seed(gateway)
            calls = [make_call(rng, seeds) for _ in range(args.requests)]
            findings = Findings()
            shares: list[list[Call]] = [calls[i:: args.workers] for i in range(args.workers)]
            threads = [threading.Thread(target=worker, args=(gateway.port, share, findings)) for share in shares]
            fired = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.monotonic() - fired
            statuses, checked, bad = check_after(gateway, storage_url, seeds)
            alive = gateway.process is not None and gateway.process.poll() is None
        finally:
            gateway.stop()
    report: dict[str, Any] = {
        "requests": args.requests, "seconds_sending": round(elapsed, 1),
        "seconds_total": round(time.monotonic() - started, 1),
        "responses_by_status": dict(sorted(findings.statuses.items())),
        "server_errors_5xx": len(findings.server_errors), "error_bodies_outside_the_shape": len(findings.bad_shapes),
        "dead_keepalive_connections": len(findings.dead_keepalive), "foreign_records_served": len(findings.leaks),
        "runs_by_status": statuses, "runs_left_pending": statuses.get("pending", 0),
        "seeded_artifacts_checked": checked, "seeded_artifacts_not_byte_exact": len(bad), "gateway_alive": alive,
        "samples": {"5xx": findings.server_errors[:5], "shape": findings.bad_shapes[:5],
                    "keepalive": findings.dead_keepalive[:5], "leaks": findings.leaks[:5], "artifacts": bad[:5]},
    }
    ok = (not findings.server_errors and not findings.bad_shapes and not findings.dead_keepalive
          and not findings.leaks and not statuses.get("pending") and not bad and alive
          and sum(findings.statuses.values()) >= args.requests * 0.99)
    return print_report(report, ok, args.json)


if __name__ == "__main__":
    sys.exit(main())
