"""Every line a real `gateway serve` writes, on stdout and on stderr, is one JSON object (issue 28).

The gateway runs as users start it (scripts/processes.py), against the fake upstream, and is driven
by the openai and anthropic SDKs (chat, streaming, responses, messages), by refusals (a bad key, an
unknown model, a rate limit, a body that is no JSON), by an upstream failure and by a request that
makes LiteLLM's response types warn through Python's warnings module; then by the real Codex and
Claude Code CLIs. Each request's lines carry its id, refusals their tenant and code, and the
startup line names storage, Redis, models and policies without a password. The same holds with
`--workers 2` (where LiteLLM is made to print, and its prints become records) and, as text, with
`log_format: text`.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest
import yaml
from sqlalchemy.engine import make_url

from scripts.processes import Gateway, free_port
from tests.conftest import REDIS_URL, TENANT_KEY, installed
from testkit.fake_upstream import FakeUpstream
from testkit.gateway import within_one_rate_window
from tests.gateway.agents.test_claude_code import CLAUDE, FILES, agent
from tests.gateway.agents.test_codex_cli import CODEX, COMMANDS, codex_config
from tests.gateway.agents.test_codex_cli import model as codex_model

THROTTLED_KEY = "sk-throttled-1"
PASSWORD = "pg-s3cret-word"
USER = [{"role": "user", "content": "What is in the README?"}]
BANNERS = ("Give Feedback", "Get Help", "LiteLLM.Info", "Provider List", "\x1b[")
REQUEST_ID = "x-gateway-request-id"


def write_config(folder: Path, fake: FakeUpstream, storage_url: str, **extra: Any) -> Path:
    config = {
        "models": [
            {"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": fake.api_base,
                                                 "api_key": "sk-upstream"}},
            {"name": "claude-*", "litellm_params": {"model": "anthropic/claude-*", "api_base": fake.url,
                                                     "api_key": "sk-upstream"}},
            {"name": "gpt-5.1-codex", "litellm_params": {"model": "openai/gpt-5.1-codex",
                                                          "api_base": fake.api_base, "api_key": "sk-upstream"}},
        ],
        "tenants": [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "coding-agent"},
                    {"id": "throttled", "api_keys": [THROTTLED_KEY], "limits": {"requests_per_minute": 1}}],
        "storage": {"url": storage_url, "blob_dir": str(folder / "blobs")},
        "router": {"num_retries": 0},
        "log_level": "info",
        **extra,
    }
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def serve(folder: Path, config: Path, workers: int = 1, env: dict[str, str] | None = None) -> Gateway:
    return Gateway(config, free_port(), folder / "stdout.log", workers=workers, errors=folder / "stderr.log",
                   env={**os.environ, **(env or {})}, ready_seconds=180).start()


def json_lines(gateway: Gateway) -> list[dict[str, Any]]:
    """Every line of the server's stdout and stderr, each parsed: a line that is not one JSON object fails."""
    records = []
    for path in (gateway.log, gateway.errors):
        assert path is not None
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                record = json.loads(line)
            except ValueError:
                pytest.fail(f"{path.name} line {number} is not JSON: {line[:300]!r}")
            assert isinstance(record, dict), f"{path.name} line {number}: {line[:300]!r}"
            records.append(record)
    return records


def drive(url: str, fake: FakeUpstream) -> dict[str, str]:
    """The SDK traffic and the refusals; the gateway's request id of each, by what it was."""
    ids: dict[str, str] = {}
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=TENANT_KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="fake", messages=USER)
    ids["chat"] = raw.headers[REQUEST_ID]
    assert raw.parse().choices[0].message.content == "ok"
    with client.chat.completions.with_streaming_response.create(model="fake", messages=USER, stream=True) as streamed:
        ids["chat_stream"] = streamed.headers[REQUEST_ID]
        assert any("[DONE]" in line for line in streamed.iter_lines())
    raw_response = client.responses.with_raw_response.create(model="gpt-5.1-codex", input="What is in the README?")
    ids["responses"] = raw_response.headers[REQUEST_ID]
    assert raw_response.parse().output_text
    # LiteLLM's usage type makes Pydantic warn (a UserWarning) as it serializes a streamed response
    with client.responses.with_streaming_response.create(model="gpt-5.1-codex", input="hi", stream=True) as events:
        ids["responses_stream"] = events.headers[REQUEST_ID]
        assert any("response.completed" in line for line in events.iter_lines())
    claude = anthropic.Anthropic(base_url=url, api_key=TENANT_KEY, max_retries=0)
    message = claude.messages.with_raw_response.create(model="claude-sonnet-4-5", max_tokens=64, messages=USER)
    ids["messages"] = message.headers[REQUEST_ID]
    assert message.parse().content
    with claude.messages.with_streaming_response.create(model="claude-sonnet-4-5", max_tokens=64, messages=USER,
                                                        stream=True) as streamed:
        ids["messages_stream"] = streamed.headers[REQUEST_ID]
        assert any("message_stop" in line for line in streamed.iter_lines())
    refusals = {
        "bad_key": (openai.AuthenticationError, lambda: openai.OpenAI(
            base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0).chat.completions.create(model="fake", messages=USER)),
        "unknown_model": (openai.NotFoundError, lambda: client.chat.completions.create(model="no-such-model",
                                                                                        messages=USER)),
        "upstream_error": (openai.InternalServerError, lambda: (fake.script(status=500), client.chat.completions.create(
            model="fake", messages=USER))),
    }
    throttled = openai.OpenAI(base_url=f"{url}/v1", api_key=THROTTLED_KEY, max_retries=0)
    within_one_rate_window()
    throttled.chat.completions.create(model="fake", messages=USER)  # its one request of the minute
    refusals["rate_limited"] = (openai.RateLimitError, lambda: throttled.chat.completions.create(model="fake",
                                                                                                 messages=USER))
    for name, (error, call) in refusals.items():
        with pytest.raises(error) as refused:
            call()
        ids[name] = refused.value.response.headers[REQUEST_ID]
    bad_json = httpx.post(f"{url}/v1/chat/completions", content=b'{"model": "fake", "messages": [',
                          headers={"authorization": f"Bearer {TENANT_KEY}", "content-type": "application/json"})
    assert bad_json.status_code == 400
    ids["bad_json"] = bad_json.headers[REQUEST_ID]
    return ids


REFUSALS = {"bad_key": (401, None, "invalid_api_key"), "unknown_model": (404, "acme", "model_not_found"),
            "rate_limited": (429, "throttled", "rate_limit_exceeded"), "bad_json": (400, "acme", "invalid_json"),
            "upstream_error": (500, "acme", "upstream_error")}


def check_requests(records: list[dict[str, Any]], ids: dict[str, str]) -> None:
    """Each request: one access line with its id; refusals with tenant and code; the warning and the
    upstream failure logged under the id of the request that caused them; no banner, no colour."""
    access = {r["request_id"]: r for r in records if r["logger"] == "gateway.access"}
    for name, request_id in ids.items():
        assert request_id in access, name
        if name in REFUSALS:
            line = access[request_id]
            assert (line["status"], line.get("tenant"), line["code"]) == REFUSALS[name], (name, line)
        else:
            assert (access[request_id]["status"], access[request_id]["tenant"]) == (200, "acme"), name
    [warning] = [r for r in records if r["logger"] == "py.warnings"]
    assert "PydanticSerializationUnexpectedValue" in warning["message"]
    assert (warning["request_id"], warning["tenant"]) == (ids["responses_stream"], "acme")
    [failure] = [r for r in records if r["logger"] == "gateway.upstream"]
    assert (failure["request_id"], failure["tenant"], failure["code"]) == (ids["upstream_error"], "acme",
                                                                         "upstream_error")
    text = json.dumps(records)
    assert not any(banner in text for banner in BANNERS)


def served_lines(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines of one process from its first request to its shutdown, each naming the request it was
    written for (all but uvicorn's "running on" line)."""
    started = next(i for i, r in enumerate(records) if r["message"] == "Application startup complete.")
    ended = next(i for i, r in enumerate(records) if r["message"] == "Shutting down")
    served = [r for r in records[started + 1:ended] if r["logger"] != "uvicorn.error"]
    assert served and all("request_id" in r for r in served), [r for r in served if "request_id" not in r][:3]
    return served


def startup_line(records: list[dict[str, Any]]) -> dict[str, Any]:
    [ready] = [r for r in records if r["message"].startswith("gateway ready")]
    assert ready["models"] == ["fake", "claude-*", "gpt-5.1-codex"]
    assert {tuple(tenants) for tenants in ready["policies"].values()} == {("acme",), ("throttled",)}
    return ready


def test_every_line_of_a_served_session_is_json_and_names_its_request(
        fake: FakeUpstream, postgres_url: str, redis_prefix: str, tmp_path: Path) -> None:
    storage_url = make_url(postgres_url).set(password=PASSWORD).render_as_string(hide_password=False)
    config = write_config(tmp_path, fake, storage_url, redis={"url": REDIS_URL, "key_prefix": redis_prefix})
    gateway = serve(tmp_path, config)
    try:
        ids = drive(gateway.url, fake)
    finally:
        gateway.stop()
    records = json_lines(gateway)
    check_requests(records, ids)
    ready = startup_line(records)
    assert (ready["storage"], ready["redis"]) == ("postgresql", REDIS_URL)
    assert PASSWORD not in gateway.log.read_text() + gateway.errors.read_text()  # type: ignore[union-attr]
    # LiteLLM printed nothing (its banners and verbose prints are off), and from the first request to
    # the shutdown every line names the request it was written for.
    assert not [r for r in records if r["logger"].startswith("stray.")]
    served = served_lines(records)
    print(f"json logs: {len(records)} lines checked, {len(served)} written while serving, {len(ids)} requests")


def test_every_line_is_json_with_two_workers_and_what_litellm_prints_becomes_records(
        fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> None:
    # LiteLLM prints each call's logging payload with print() when this is set: a real stray print
    gateway = serve(tmp_path, write_config(tmp_path, fake, sqlite_url), workers=2,
                    env={"LITELLM_PRINT_STANDARD_LOGGING_PAYLOAD": "1"})
    try:
        ids = drive(gateway.url, fake)
    finally:
        gateway.stop()
    records = json_lines(gateway)
    assert gateway.log.read_text() == ""  # stdout: LiteLLM's prints went through the logging module
    check_requests(records, ids)
    assert len({r["pid"] for r in records if r["message"].startswith("gateway ready")}) == 2
    printed = [r for r in records if r["logger"] == "stray.stdout"]
    assert printed and all(r["level"] == "warning" for r in printed)
    assert {r.get("request_id") for r in printed} & set(ids.values())  # a print names the request it was made in
    print(f"json logs, 2 workers: {len(records)} lines checked, {len(printed)} of them LiteLLM's prints")


def test_text_logs_name_the_request_on_every_line_of_it(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> None:
    gateway = serve(tmp_path, write_config(tmp_path, fake, sqlite_url, log_format="text"))
    try:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=TENANT_KEY, max_retries=0)
        chat = client.chat.completions.with_raw_response.create(model="fake", messages=USER).headers[REQUEST_ID]
        with client.responses.with_streaming_response.create(model="gpt-5.1-codex", input="hi", stream=True) as events:
            streamed = events.headers[REQUEST_ID]
            list(events.iter_lines())
        with pytest.raises(openai.NotFoundError) as refused:
            client.chat.completions.create(model="no-such-model", messages=USER)
        unknown = refused.value.response.headers[REQUEST_ID]
    finally:
        gateway.stop()
    text = gateway.errors.read_text()  # type: ignore[union-attr]
    assert gateway.log.read_text() == "" and not any(banner in text for banner in BANNERS)
    lines = text.splitlines()
    assert any(f" INFO gateway.access {chat} POST /v1/chat/completions 200" in line for line in lines)
    assert any(f" WARNING py.warnings {streamed} " in line and "UserWarning" in line for line in lines)
    [refusal] = [line for line in lines if f"gateway.access {unknown} " in line]
    assert " tenant=acme " in refusal and " code=model_not_found " in refusal
    assert any(" INFO gateway gateway ready: sqlite storage, no redis, 3 models" in line for line in lines)


@pytest.fixture
def agents_gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[Gateway]:
    gateway = serve(tmp_path, write_config(tmp_path, fake, sqlite_url))
    yield gateway
    gateway.stop()
    fake.state.responder = fake.state.responses_responder = None


def test_every_line_is_json_while_codex_and_claude_code_run(agents_gateway: Gateway, fake: FakeUpstream,
                                                            tmp_path: Path) -> None:
    codex = installed(CODEX, "`npm install --prefix tests/clients` installs the pinned Codex CLI")
    claude = installed(CLAUDE, "`npm install --prefix tests/clients` installs the pinned Claude Code")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(codex_config(f"{agents_gateway.url}/v1"))
    paths = []
    for number in range(FILES):
        path = work / f"module{number}.py"
        path.write_text("".join(f"def f{number}_{i}(x):\n    return x * {i}\n" for i in range(200)))
        paths.append(path)
    fake.state.responses_responder = codex_model
    fake.state.responder = agent(paths)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home), "GATEWAY_API_KEY": TENANT_KEY,
           "ANTHROPIC_BASE_URL": agents_gateway.url, "ANTHROPIC_API_KEY": TENANT_KEY, "DISABLE_TELEMETRY": "1",
           "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    ran = subprocess.run([str(codex), "exec", "--skip-git-repo-check", "Run the six commands and report."],
                         cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    ran = subprocess.run([str(claude), "-p", "Read every module in this folder and summarise them.",
                          "--allowedTools", "Read", "Bash"], cwd=work, env=env, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    agents_gateway.stop()
    records = json_lines(agents_gateway)
    access = [r for r in records if r["logger"] == "gateway.access" and r["path"].startswith("/v1/")]
    by_path = {path: [r for r in access if r["path"] == path] for path in ("/v1/responses", "/v1/messages")}
    assert len(by_path["/v1/responses"]) >= len(COMMANDS) + 1 and len(by_path["/v1/messages"]) >= FILES + 1
    assert all(r["tenant"] == "acme" and r["request_id"].startswith("req_") for r in access)
    served_lines(records)
    # LiteLLM's usage type warns as it logs each streamed Responses call: under the id of that call
    warned = {r["request_id"] for r in records if r["logger"] == "py.warnings"}
    assert warned <= {r["request_id"] for r in by_path["/v1/responses"]}
    assert not [r for r in records if r["logger"].startswith("stray.")]
    assert not any(banner in json.dumps(records) for banner in BANNERS)
    print(f"json logs, codex and claude code: {len(records)} lines checked, {len(by_path['/v1/responses'])} "
          f"Responses and {len(by_path['/v1/messages'])} Messages requests, {len(warned)} warnings")
