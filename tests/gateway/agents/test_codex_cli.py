"""The real Codex CLI through the gateway, offline, against the fake Responses upstream.

Codex CLI (npm `@openai/codex`, pinned in tests/clients/package.json, installed
there by .ci/run) runs `codex exec --skip-git-repo-check ...` with CODEX_HOME
in a temporary folder whose config.toml names the gateway as a Responses
provider. The fake upstream plays a model that runs several commands with
Codex's own exec_command tool, each printing a large output (under Codex's
own 10 KB truncation), then answers. Codex runs the commands itself and sends
their outputs back through the gateway.
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
from tests.gateway.wire.test_openai_responses import assert_paired

CODEX = Path(__file__).resolve().parents[2] / "clients" / "node_modules" / ".bin" / "codex"
COMMANDS = [f"seq {10000 * k} {10000 * k + 1400}" for k in range(1, 7)]
FINAL = "Ran all six commands."


def model(body: dict[str, Any]) -> Step:
    """Run the next command with Codex's exec_command tool, then answer."""
    if "exec_command" not in [t.get("name") for t in body.get("tools") or []]:
        return Step(message={"role": "assistant", "content": "ok"})
    done = [i for i in body["input"] if i.get("type") == "function_call_output"]
    if len(done) < len(COMMANDS):
        return Step(message={"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_cmd{len(done)}", "type": "function",
             "function": {"name": "exec_command", "arguments": json.dumps({"cmd": COMMANDS[len(done)]})}}]})
    return Step(message={"role": "assistant", "content": FINAL})


def codex_config(api_base: str) -> str:
    """$CODEX_HOME/config.toml: the gateway at `api_base` as a Responses provider, commands run unasked."""
    return f'''model = "gpt-5.1-codex"
model_provider = "gateway"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.gateway]
name = "Context gateway"
base_url = "{api_base}"
env_key = "GATEWAY_API_KEY"
wire_api = "responses"
supports_websockets = false
'''


@pytest.fixture
def codex() -> Path:
    return installed(CODEX, "`npm install --prefix tests/clients` installs the pinned Codex CLI")


@pytest.fixture
def gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[tuple[RunningGateway, ClientBodies]]:
    models = [{"name": "gpt-5.1-codex", "litellm_params": {"model": "openai/gpt-5.1-codex", "api_base": fake.api_base,
                                                            "api_key": "sk-upstream"}}]
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "coding-agent"}]
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, models=models, tenants=tenants)
    app = create_app(settings)
    bodies = ClientBodies(app, path="/v1/responses")
    server = ServerThread(bodies).start()
    yield RunningGateway(url=server.url, settings=settings, app=app, fake=fake), bodies
    server.stop()
    fake.state.responses_responder = None


def test_codex_runs_commands_through_the_gateway(codex: Path, gateway: tuple[RunningGateway, ClientBodies],
                                                 tmp_path: Path) -> None:
    running, client_bodies = gateway
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(codex_config(running.api_base))
    running.fake.state.responses_responder = model
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home), "GATEWAY_API_KEY": TENANT_KEY}
    done = subprocess.run([str(codex), "exec", "--skip-git-repo-check", "Run the six commands and report."],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert FINAL in done.stdout
    upstream = [r["body"] for r in running.fake.requests if r.get("path") == "/v1/responses"]
    loop = [b for b in upstream if "exec_command" in [t.get("name") for t in b.get("tools") or []]]
    assert len(loop) == len(COMMANDS) + 1
    for body in upstream:
        assert_paired(body)
    sent: dict[str, Any] = {}
    for body in client_bodies.bodies:
        for item in body.get("input") or []:
            if item.get("type") == "function_call_output" and item["call_id"].startswith("call_cmd"):
                sent[item["call_id"]] = item["output"]
    assert len(sent) == len(COMMANDS)
    assert all(len(json.dumps(output)) < 12_000 for output in sent.values())  # Codex's own truncation stayed out
    forwarded = {i["call_id"]: i["output"] for i in loop[-1]["input"] if i.get("type") == "function_call_output"}
    last = f"call_cmd{len(COMMANDS) - 1:d}"
    assert forwarded[last] == sent[last]  # the latest output verbatim
    artifacts = {}
    for number in range(len(COMMANDS) - 1):
        memory = forwarded[f"call_cmd{number}"]
        assert isinstance(memory, str) and memory.startswith("[compacted artifact:art_"), str(memory)[:80]
        artifacts[f"call_cmd{number}"] = memory.split("artifact:")[1].split(";")[0]

    def output_bytes(bodies: list[dict[str, Any]]) -> int:
        return sum(len(json.dumps(i["output"])) for body in bodies for i in body.get("input") or []
                   if i.get("type") == "function_call_output")

    replayed = [b for b in client_bodies.bodies if "exec_command" in [t.get("name") for t in b.get("tools") or []]]
    ratio = output_bytes(loop) / output_bytes(replayed)
    print(f"codex: {len(loop)} agent requests, output bytes forwarded {ratio:.3f} of a plain replay")
    assert ratio <= 0.6, ratio
    with running.client() as http:
        for call_id, artifact in artifacts.items():
            raw = http.get(f"/api/artifacts/{artifact}").content
            expected = sent[call_id]
            assert raw == expected.encode() if isinstance(expected, str) else json.loads(raw) == expected
    # Codex sends no session label: its requests are one conversation by their first exchange (the first
    # request too, moved there once its answer came back), named by what the user asked, not by the
    # environment block Codex sends as a user message before it.
    with running.client() as http:
        sessions = http.get("/api/savings").json()["by_session"]
    assert [(s["requests"], s["name"]) for s in sessions] == [(len(loop), "Run the six commands and report.")]
