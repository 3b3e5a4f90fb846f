"""gateway/ops/logs.py, gateway/ops/stray_output.py and gateway/ops/startup_line.py: every line a serving process
writes is a record, and a record logged while a request is served names it (issue 28).

The same end to end, through a real `gateway serve` driven by the SDKs and the agent CLIs:
tests/gateway/ops/test_logs_served.py.
"""
from __future__ import annotations

import asyncio
import io
import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import httpx
import pytest

from gateway.app import create_app
from gateway.ops.logs import (
    JsonFormatter,
    RequestFields,
    TextFormatter,
    close_request,
    note_refusal,
    note_tenant,
    open_request,
)
from gateway.ops.startup_line import startup_fields
from gateway.ops.stray_output import LinesToLog, _unraisable
from gateway.threads import off_loop
from testkit.gateway import REPO, TENANT_KEY, settings_for
from testkit.fake_upstream import FakeUpstream, ServerThread
from tests.gateway.pipeline.test_run_recorder import FaultyUpstream


class Lines(logging.Handler):
    """Records as the gateway's handler formats them: through RequestFields, as JSON lines."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(RequestFields())
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.lines]


# The loggers these tests log through, as `gateway serve` configures them: propagating to the root's
# handler (other tests of this process start uvicorn in-process, whose own config stops "uvicorn"'s).
_LOGGERS = ("LiteLLM", "uvicorn", "uvicorn.error", "py.warnings", "gateway", "gateway.upstream")


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    root = logging.getLogger()
    before = root.level
    saved = {name: (logger.level, logger.propagate, logger.disabled)
             for name in _LOGGERS for logger in [logging.getLogger(name)]}
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.NOTSET)
        logger.propagate, logger.disabled = True, False
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield handler
    root.removeHandler(handler)
    root.setLevel(before)
    for name, (level, propagate, disabled) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate, logger.disabled = propagate, disabled


def test_a_record_logged_while_a_request_is_served_names_it_whoever_logs_it(lines: Lines) -> None:
    logging.getLogger("LiteLLM").warning("before any request")
    context, token = open_request("req_1")

    async def in_a_task() -> None:
        logging.getLogger("LiteLLM").error("in a task")

    async def served() -> None:
        logging.getLogger("uvicorn.error").warning("on the loop")
        note_tenant("acme")
        await off_loop(logging.getLogger("py.warnings").warning, "in a worker thread")
        note_refusal("rate_limit_exceeded")
        await asyncio.create_task(in_a_task())

    try:
        asyncio.run(served())
    finally:
        close_request(token)
    logging.getLogger("gateway").warning("after it", extra={"fields": {"request_id": None, "n": 1}})
    found = [(r["message"], r.get("request_id"), r.get("tenant"), r.get("code")) for r in lines.records()]
    assert found == [("before any request", None, None, None), ("on the loop", "req_1", None, None),
                     ("in a worker thread", "req_1", "acme", None),
                     ("in a task", "req_1", "acme", "rate_limit_exceeded"), ("after it", None, None, None)]
    assert context.fields() == {"request_id": "req_1", "tenant": "acme", "code": "rate_limit_exceeded"}


def test_a_records_own_fields_win_unless_they_say_none(lines: Lines) -> None:
    _, token = open_request("req_2")
    try:
        logging.getLogger("gateway.upstream").warning("x", extra={"fields": {"request_id": None, "tenant": "other"}})
    finally:
        close_request(token)
    [record] = lines.records()
    assert (record["request_id"], record["tenant"]) == ("req_2", "other")


def test_text_lines_put_the_request_id_up_front() -> None:
    record = logging.LogRecord("LiteLLM", logging.WARNING, __file__, 1, "slow", (), None)
    record.gateway_request = {"request_id": "req_3", "tenant": "acme", "code": "upstream_timeout"}
    assert TextFormatter().format(record).endswith(" WARNING LiteLLM req_3 slow tenant=acme code=upstream_timeout")
    plain = logging.LogRecord("gateway", logging.INFO, __file__, 1, "ready", (), None)
    assert TextFormatter().format(plain).endswith(" INFO gateway ready")


def test_an_exception_a_request_ends_in_is_logged_with_its_id_tenant_and_code(
        fake: FakeUpstream, sqlite_url: str, tmp_path: Path, lines: Lines) -> None:
    server = ServerThread(create_app(settings_for(fake.api_base, sqlite_url, tmp_path),
                                     upstream=FaultyUpstream())).start()
    try:
        answer = httpx.post(f"{server.url}/v1/chat/completions", headers={"authorization": f"Bearer {TENANT_KEY}"},
                            json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
    finally:
        server.stop()
    assert answer.status_code == 500
    request_id = answer.headers["x-gateway-request-id"]
    [failure] = [r for r in lines.records() if "exception" in r]
    assert failure["message"].startswith("unhandled error on /v1/chat/completions")
    assert "RuntimeError: boom in complete" in failure["exception"]
    assert (failure["request_id"], failure["tenant"], failure["code"]) == (request_id, "acme", "internal_error")
    [access] = [r for r in lines.records() if r["logger"] == "gateway.access" and r["request_id"] == request_id]
    assert (access["status"], access["tenant"], access["code"]) == (500, "acme", "internal_error")


def test_what_is_printed_becomes_one_record_per_write_without_colours(lines: Lines) -> None:
    underlying = io.StringIO()
    stream = LinesToLog(underlying, "stray.stdout")
    print("\x1b[1;31mGive Feedback / Get Help\x1b[0m", file=stream)
    print(json.dumps({"a": 1, "b": [2]}, indent=4), file=stream)
    print(file=stream)  # a blank line says nothing
    stream.write("no end of line yet")
    assert [r["message"] for r in lines.records()] == ["Give Feedback / Get Help", '{\n    "a": 1,\n    "b": [\n'
                                                        '        2\n    ]\n}']
    stream.close()
    assert lines.records()[-1]["message"] == "no end of line yet"
    assert {r["logger"] for r in lines.records()} == {"stray.stdout"} and underlying.getvalue() == ""
    assert not stream.isatty() and stream.writable()


def test_an_exception_python_would_print_as_ignored_is_one_record(lines: Lines) -> None:
    try:
        raise ValueError("in __del__")
    except ValueError as error:
        _unraisable(SimpleNamespace(err_msg=None, object="<socket>", exc_type=ValueError, exc_value=error,
                                    exc_traceback=error.__traceback__))
    [record] = lines.records()
    assert record["message"] == "Exception ignored in: '<socket>'" and "ValueError: in __del__" in record["exception"]


SERVING = """
import logging, sys, threading, warnings
from gateway.ops.logs import serve_logging
serve_logging("info", "json")
warnings.warn("a library's warning")
print("a library's print")
print("\\x1b[92mcoloured\\x1b[0m", file=sys.stderr)
threading.Thread(target=lambda: 1 / 0).start()
class Leaky:
    def __del__(self):
        raise OSError("closing failed")
Leaky()
logging.getLogger("LiteLLM").warning("its own logger")
logging.getLogger("LiteLLM").info("its info: said at log_level debug only")
logging.getLogger("alembic").info("another library's info: below warning, not shown")
raise SystemExit("the end")
"""


def test_a_serving_process_writes_nothing_but_json_lines() -> None:
    done = subprocess.run([sys.executable, "-c", SERVING], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout == ""
    records = [json.loads(line) for line in done.stderr.splitlines()]  # every line is one JSON object
    said = {(r["logger"], r["message"].split("\n")[0]) for r in records}
    assert ("stray.stdout", "a library's print") in said and ("stray.stderr", "coloured") in said
    assert ("LiteLLM", "its own logger") in said and not any("its info" in message for _, message in said)
    assert ("python", "exception in thread Thread-1 (<lambda>)") in said
    assert any(logger == "py.warnings" and "UserWarning: a library's warning" in message for logger, message in said)
    assert any(r["logger"] == "python" and "OSError: closing failed" in r.get("exception", "") for r in records)
    assert ("stray.stderr", "the end") in said  # SystemExit's message, printed by Python as it exits
    assert not any(r["logger"] == "alembic" for r in records)


def test_the_startup_line_names_what_the_gateway_stands_on_without_a_password(tmp_path: Path) -> None:
    settings = settings_for(
        "http://127.0.0.1:9/v1", "postgresql+psycopg://gw:pg-s3cret@db:5432/gw?password=pg-s3cret", tmp_path,
        redis={"url": "redis://:redis-s3cret@cache:6379/0"},
        tenants=[{"id": "acme", "api_keys": [TENANT_KEY], "policy": "coding-agent"},
                 {"id": "globex", "api_keys": ["sk-globex-1"], "policy": "coding-agent"},
                 {"id": "initech", "api_keys": ["sk-initech-1"]}])
    from gateway.config import tenant_policies

    fields = startup_fields(settings, tenant_policies(settings))
    text = json.dumps(fields)
    assert "s3cret" not in text
    assert (fields["storage"], fields["redis"]) == ("postgresql", "redis://:***@cache:6379/0")
    assert fields["storage_url"].startswith("postgresql+psycopg://gw:***@db:5432/gw")
    assert fields["models"] == ["fake", "demo"]
    assert sorted((name.split()[0], tenants) for name, tenants in fields["policies"].items()) == [
        ("coding-agent", ["acme", "globex"]), ("default", ["initech"])]
