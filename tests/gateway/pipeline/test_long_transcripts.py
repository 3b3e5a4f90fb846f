"""A transcript of 66,000 messages through `gateway serve` (issue 27), on SQLite and on PostgreSQL.

Before, on PostgreSQL: the capture committed the run, then a read with one bind parameter per path node
passed psycopg's 65,535 and failed; the answer was a 500, the run stayed `pending` for good, and the
error's log line held every parameter (2 MB). Here the request succeeds under `server.max_messages`, a
second request that extends the transcript succeeds too (the known prefix), a transcript past the limit
is a 400 in each wire format's own shape that names it, every run is recorded with a final status, and
no line of the server's log passes 10 KB.
"""
from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy
import yaml

from scripts.processes import TENANT_KEY, Gateway, fake_upstream, free_port, write_config
from testkit.gateway import settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream

MESSAGES = 66_000
LIMIT = MESSAGES + 10  # the first two requests fit; a transcript of LIMIT + 1 items does not
LINE_MOST = 10_000


def _round(n: int) -> list[dict[str, Any]]:
    """One agent round: most with one call, every fifth with two in parallel, every tenth ending in a
    word to the user and the user's next instruction; results mostly small, a few past inline_max_bytes."""
    calls = [f"call_{n}_{k}" for k in range(2 if n % 5 == 0 else 1)]
    out: list[dict[str, Any]] = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call, "type": "function", "function": {"name": "read_file" if n % 3 else "bash",
                                                      "arguments": json.dumps({"path": f"src/m{n % 97}.py"})}}
        for call in calls]}]
    for k, call in enumerate(calls):
        content = f"line {n}.{k}: ok\n" * (200 if n % 1000 == 7 else 1 + n % 4)  # 1 in 1,000 is 3 KB
        out.append({"role": "tool", "tool_call_id": call, "content": content})
    if n % 10 == 9:
        out += [{"role": "assistant", "content": f"Done with step {n}."}, {"role": "user", "content": "Go on."}]
    return out


@functools.lru_cache(maxsize=1)
def transcript() -> tuple[dict[str, Any], ...]:
    """MESSAGES messages, built once for the module."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Refactor the repository."}]
    n = 0
    while len(messages) < MESSAGES:
        messages += _round(n)
        n += 1
    while messages[MESSAGES - 1]["role"] == "assistant" and messages[MESSAGES - 1].get("tool_calls"):
        n += 1  # never cut between a call and its result
        messages = messages[:MESSAGES - 1] + [{"role": "user", "content": "Go on."}] + messages[MESSAGES:]
    return tuple(messages[:MESSAGES])


def _cpu_seconds(pid: int) -> float:
    """The CPU time a process has used (user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _post(url: str, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{url}{path}", content=json.dumps(body).encode(), timeout=300,
                      headers={"authorization": f"Bearer {TENANT_KEY}", "content-type": "application/json",
                               **headers})


def test_a_transcript_past_the_bind_limit_is_served_recorded_and_logged_in_short_lines(
        storage_url: str, tmp_path: Path) -> None:
    messages = list(transcript())
    assert len(messages) == MESSAGES and sum(m["role"] == "tool" for m in messages) > 25_000
    extended = messages + _round(10**6)[:3]  # a new call, its result: the known prefix and a new round
    started = time.monotonic()
    with fake_upstream() as upstream:
        config = write_config(tmp_path, storage_url, upstream, max_messages=LIMIT)
        raw = yaml.safe_load(config.read_text())
        config.write_text(yaml.safe_dump({**raw, "log_level": "info"}))  # the access lines too
        log = tmp_path / "gateway.log"
        gateway = Gateway(config, free_port(), log, ready_seconds=300).start()  # a busy machine
        try:
            first = _post(gateway.url, "/v1/chat/completions", {"model": "fake", "messages": messages})
            second = _post(gateway.url, "/v1/chat/completions", {"model": "fake", "messages": extended})
            too_many = [{"role": "user", "content": "x"}] * (LIMIT + 1)
            refused = {
                "chat": _post(gateway.url, "/v1/chat/completions", {"model": "fake", "messages": too_many}),
                "responses": _post(gateway.url, "/v1/responses", {"model": "fake", "input": too_many}),
                "anthropic": _post(gateway.url, "/v1/messages", {"model": "fake", "max_tokens": 10,
                                                                "messages": too_many}),
            }
            cpu = _cpu_seconds(gateway.process.pid) if gateway.process is not None else 0.0
        finally:
            gateway.stop()
    served = time.monotonic() - started
    assert first.status_code == 200, first.text[:2000]
    assert second.status_code == 200, second.text[:2000]
    named = f"this gateway takes at most {LIMIT} per request (server.max_messages)"
    openai_error = {"type": "invalid_request_error", "code": "too_many_messages"}
    assert (refused["chat"].status_code, refused["chat"].json()) == (400, {"error": {
        **openai_error, "message": f"messages: {LIMIT + 1} items; {named}", "param": "messages"}})
    assert (refused["responses"].status_code, refused["responses"].json()) == (400, {"error": {
        **openai_error, "message": f"input: {LIMIT + 1} items; {named}", "param": "input"}})
    assert (refused["anthropic"].status_code, refused["anthropic"].json()) == (400, {"type": "error", "error": {
        "type": "invalid_request_error", "message": f"messages: {LIMIT + 1} items; {named}"}})

    engine = sqlalchemy.create_engine(storage_url)
    try:
        with engine.connect() as connection:
            runs = connection.execute(sqlalchemy.text(
                "SELECT id, status, message_count FROM model_runs ORDER BY started_at")).all()
    finally:
        engine.dispose()
    assert [(run.id, run.status, run.message_count) for run in runs] == [
        (first.headers["x-gateway-request-id"], "ok", MESSAGES),
        (second.headers["x-gateway-request-id"], "ok", len(extended))]  # none pending; the refused stored none

    lines = log.read_bytes().splitlines()
    assert lines and max(len(line) for line in lines) <= LINE_MOST
    print(f"\nstarted, served, refused and stopped in {served:.1f} s (the gateway's CPU {cpu:.1f} s); "
          f"{len(lines)} log lines, the longest {max(len(line) for line in lines)} bytes")


USER = {"role": "user", "content": "x"}
NAMED = "this gateway takes at most 3 per request (server.max_messages)"


@pytest.mark.parametrize("path, field, base, error", [
    ("/v1/chat/completions", "messages", {"model": "fake"}, {"error": {
        "message": f"messages: 4 items; {NAMED}", "type": "invalid_request_error", "param": "messages",
        "code": "too_many_messages"}}),
    ("/v1/responses", "input", {"model": "fake"}, {"error": {
        "message": f"input: 4 items; {NAMED}", "type": "invalid_request_error", "param": "input",
        "code": "too_many_messages"}}),
    ("/v1/messages", "messages", {"model": "fake", "max_tokens": 5}, {"type": "error", "error": {
        "type": "invalid_request_error", "message": f"messages: 4 items; {NAMED}"}}),
    ("/v1/messages/count_tokens", "messages", {"model": "fake"}, {"type": "error", "error": {
        "type": "invalid_request_error", "message": f"messages: 4 items; {NAMED}"}}),
], ids=["chat", "responses", "anthropic", "count_tokens"])
def test_past_the_limit_is_a_400_in_the_callers_shape_and_nothing_is_stored(
        fake: FakeUpstream, sqlite_url: str, tmp_path: Path, path: str, field: str, base: dict, error: dict) -> None:
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path,
                                                 server={"max_messages": 3}), fake)
    try:
        with running.client() as http:
            at_the_limit = http.post(path, json={**base, field: [USER] * 3})
            refused = http.post(path, json={**base, field: [USER] * 4})
    finally:
        server.stop()
    assert at_the_limit.status_code == 200, at_the_limit.text
    assert (refused.status_code, refused.json()) == (400, error)
    counted = path.endswith("count_tokens")  # answered here: nothing stored or forwarded either way
    with running.store.engine.connect() as connection:
        runs = connection.execute(sqlalchemy.text("SELECT count(*) FROM model_runs")).scalar()
    assert runs == len(fake.requests) == (0 if counted else 1)  # the refused request stored and sent nothing


def test_a_continued_conversation_past_the_limit_names_previous_response_id(
        fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> None:
    """The transcript a `previous_response_id` continues counts with the new input."""
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path,
                                                 server={"max_messages": 3}), fake)
    try:
        with running.client() as http:
            first = http.post("/v1/responses", json={"model": "fake", "input": [USER] * 2})
            refused = http.post("/v1/responses", json={"model": "fake", "input": [USER] * 2,
                                                       "previous_response_id": first.json()["id"]})
    finally:
        server.stop()
    assert first.status_code == 200
    assert (refused.status_code, refused.json()["error"]) == (400, {
        "message": "previous_response_id: the conversation it continues holds 5 messages with this input; "
                   "this gateway takes at most 3 per request (server.max_messages)",
        "type": "invalid_request_error", "param": "previous_response_id", "code": "too_many_messages"})
