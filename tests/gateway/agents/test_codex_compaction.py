"""Codex CLI's remote compaction through the gateway, offline, on an OpenAI and on an Anthropic upstream (issue 32).

The real Codex CLI (0.169.0, pinned in tests/clients/package.json) with its built-in OpenAI provider,
pointed at the gateway (`openai_base_url` in $CODEX_HOME/config.toml: 0.169.0 no longer reads the
OPENAI_BASE_URL variable, which is set too) and a low `model_auto_compact_token_limit`, runs six
commands, each printing a large output, so its context passes the limit and it compacts remotely: a
streamed `POST /v1/responses` ending in a `compaction_trigger` item, answered with one `compaction` item
that Codex then sends back in place of what it compacted. The fake model runs the next command it has
not seen the output of, so a compaction that lost the conversation would make it start again and the
session would not finish.

Through the gateway to (1) the fake's OpenAI Responses API, the compaction is forwarded to its
`/v1/responses/compact` and its item returned (the fake reads its own item back on later requests);
(2) an Anthropic deployment (the fake's /v1/messages), which has no such endpoint, the gateway answers
with its own item and puts the stored transcript back in its place. Either way Codex finishes with the
fake model's final answer, and every compaction is a row the API lists.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from gateway.app import create_app
from gateway.fake_upstream.state import Step
from tests.conftest import TENANT_KEY, RunningGateway, installed, settings_for
from testkit.fake_upstream import FakeUpstream, ServerThread
from tests.gateway.agents.test_claude_code import ClientBodies

CODEX = Path(__file__).resolve().parents[2] / "clients" / "node_modules" / ".bin" / "codex"
COMMANDS = [f"seq {10000 * k} {10000 * k + 1400}" for k in range(1, 7)]
FINAL = "Ran all six commands after compacting."
LIMIT = 12_000  # tokens: past it once a command's output is in (the first request is about 10,000)


def responses_model(body: dict[str, Any]) -> Step:
    """The OpenAI side: run the next command whose output it has not seen (compacted ones included), then answer."""
    if "exec_command" not in [t.get("name") for t in body.get("tools") or []]:
        return Step(message={"role": "assistant", "content": "ok"})
    done = len([i for i in body["input"] if i.get("type") == "function_call_output"])
    if done < len(COMMANDS):
        return Step(message={"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_cmd{done}", "type": "function",
             "function": {"name": "exec_command", "arguments": json.dumps({"cmd": COMMANDS[done]})}}]})
    return Step(message={"role": "assistant", "content": FINAL})


def messages_model(body: dict[str, Any]) -> Step:
    """The Anthropic side: the same agent over Messages' blocks."""
    if "exec_command" not in [t.get("name") for t in body.get("tools") or []]:
        return Step(blocks=[{"type": "text", "text": "ok"}])
    done = sum(1 for m in body["messages"] if isinstance(m.get("content"), list)
               for b in m["content"] if b.get("type") == "tool_result")
    if done < len(COMMANDS):
        return Step(blocks=[{"type": "tool_use", "id": f"toolu_cmd{done}", "name": "exec_command",
                             "input": {"cmd": COMMANDS[done]}}])
    return Step(blocks=[{"type": "text", "text": FINAL}])


def codex_config(api_base: str) -> str:
    """$CODEX_HOME/config.toml: the built-in OpenAI provider at the gateway, a low auto-compaction limit."""
    return f'''model = "gpt-5.1-codex"
openai_base_url = "{api_base}"
model_auto_compact_token_limit = {LIMIT}
approval_policy = "never"
sandbox_mode = "danger-full-access"
'''


@pytest.fixture
def codex() -> Path:
    return installed(CODEX, "`npm install --prefix tests/clients` installs the pinned Codex CLI")


def _deployment(kind: str, fake: FakeUpstream) -> dict[str, Any]:
    if kind == "openai":
        return {"model": "openai/gpt-5.1-codex", "api_base": fake.api_base, "api_key": "sk-upstream"}
    # drop_params: LiteLLM refuses what Codex sends that Messages has no place for (prompt_cache_key)
    return {"model": "anthropic/claude-sonnet-4-5", "api_base": fake.url, "api_key": "sk-ant-upstream",
            "drop_params": True}


@pytest.fixture(params=["openai", "anthropic"])
def gateway(request: pytest.FixtureRequest, fake: FakeUpstream, sqlite_url: str,
            tmp_path: Path) -> Iterator[tuple[str, RunningGateway, ClientBodies]]:
    models = [{"name": "gpt-5.1-codex", "litellm_params": _deployment(request.param, fake)}]
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "coding-agent"}]
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, models=models, tenants=tenants)
    app = create_app(settings)
    bodies = ClientBodies(app, path="/v1/responses")
    server = ServerThread(bodies).start()
    yield request.param, RunningGateway(url=server.url, settings=settings, app=app, fake=fake), bodies
    server.stop()
    fake.state.responses_responder = None
    fake.state.responder = None


def test_codex_compacts_remotely_through_the_gateway(codex: Path, gateway: tuple[str, RunningGateway, ClientBodies],
                                                     tmp_path: Path) -> None:
    kind, running, client_bodies = gateway
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(codex_config(running.api_base))
    running.fake.state.responses_responder = responses_model
    running.fake.state.responder = messages_model
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home), "CODEX_API_KEY": TENANT_KEY, "OPENAI_API_KEY": TENANT_KEY,
           "OPENAI_BASE_URL": running.api_base}
    done = subprocess.run([str(codex), "exec", "--skip-git-repo-check", "Run the six commands and report."],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert FINAL in done.stdout, done.stderr[-3000:]
    assert "Error running remote compact task" not in done.stderr

    triggers = [b for b in client_bodies.bodies if (b.get("input") or [{}])[-1].get("type") == "compaction_trigger"]
    assert triggers, "Codex never compacted: lower LIMIT"
    returned = [i for b in client_bodies.bodies for i in b.get("input") or [] if i.get("type") == "compaction"]
    assert returned, "Codex never sent a compaction item back"
    ran = {i["call_id"] for b in client_bodies.bodies for i in b.get("input") or []
           if i.get("type") == "function_call_output"}
    assert ran == {f"call_cmd{n}" for n in range(len(COMMANDS))} or \
        ran == {f"toolu_cmd{n}" for n in range(len(COMMANDS))}  # each command once: nothing was lost

    with running.client() as http:
        compactions = http.get("/api/compactions").json()["data"]
    assert len(compactions) == len(triggers)
    assert {c["endpoint"] for c in compactions} == {"responses"}
    compact_calls = [r for r in running.fake.requests if r.get("path") == "/v1/responses/compact"]
    if kind == "openai":
        assert {c["source"] for c in compactions} == {"provider"}
        assert len(compact_calls) == len(triggers)
        assert all(i["encrypted_content"].startswith("fake-compaction:") for i in returned)
    else:
        assert {c["source"] for c in compactions} == {"gateway"} and not compact_calls
        assert all(i["encrypted_content"].startswith("gwc1.") for i in returned)
        # the transcript came back in the item's place: the model saw every earlier output
        last = [r["body"] for r in running.fake.requests if r.get("path") == "/v1/messages"][-1]
        results = [b for m in last["messages"] if isinstance(m.get("content"), list)
                   for b in m["content"] if b.get("type") == "tool_result"]
        assert len(results) == len(COMMANDS)
        asked = [m for m in last["messages"] if "Run the six commands and report." in json.dumps(m.get("content"))]
        assert len(asked) == 1  # the user's message Codex kept beside the item is the transcript's, not twice
    print(f"codex ({kind}): {len(triggers)} compactions, {len(client_bodies.bodies)} requests")
