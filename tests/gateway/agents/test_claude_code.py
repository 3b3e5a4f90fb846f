"""The real Claude Code CLI through the gateway, offline, against the fake Anthropic upstream.

Claude Code (npm `@anthropic-ai/claude-code`, pinned in tests/clients/package.json,
installed there by .ci/run) runs `claude -p ... --allowedTools Read Bash` in a
folder of large files, with ANTHROPIC_BASE_URL at the gateway and a temporary
HOME. The fake upstream plays an agent that reads every file with Claude
Code's own Read tool, one per turn, then answers. Claude Code executes the
reads itself and sends the results back through the gateway.
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
from tests.gateway.wire.test_anthropic_messages import assert_valid_anthropic_request

CLAUDE = Path(__file__).resolve().parents[2] / "clients" / "node_modules" / ".bin" / "claude"
FILES = 6
FINAL = "All six modules read: each defines two hundred small functions."


class ClientBodies:
    """Plain ASGI middleware that keeps what the client sent to one path (the test's own record)."""

    def __init__(self, app: Any, path: str = "/v1/messages") -> None:
        self.app = app
        self.path = path
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        self.bodies.append(json.loads(b"".join(chunks)))
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


def agent(paths: list[Path]) -> Any:
    """The scripted model: read the next file with Claude Code's Read tool, then answer."""

    def respond(body: dict[str, Any]) -> Step:
        if "Read" not in [t.get("name") for t in body.get("tools") or []]:
            return Step(blocks=[{"type": "text", "text": "ok"}])  # a side request (titles, topics)
        done = sum(1 for m in body["messages"] if isinstance(m["content"], list)
                   for b in m["content"] if b.get("type") == "tool_result" and b["tool_use_id"].startswith("toolu_r"))
        if done < len(paths):
            return Step(blocks=[{"type": "text", "text": f"Reading module {done}."},
                                {"type": "tool_use", "id": f"toolu_r{done:02d}", "name": "Read",
                                 "input": {"file_path": str(paths[done])}}])
        return Step(blocks=[{"type": "text", "text": FINAL}])

    return respond


@pytest.fixture
def claude() -> Path:
    return installed(CLAUDE, "`npm install --prefix tests/clients` installs the pinned Claude Code")


@pytest.fixture
def gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[tuple[RunningGateway, ClientBodies]]:
    models = [{"name": "claude-*", "litellm_params": {"model": "anthropic/claude-*", "api_base": fake.url,
                                                       "api_key": "sk-upstream"}}]
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "coding-agent"}]
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, models=models, tenants=tenants)
    app = create_app(settings)
    bodies = ClientBodies(app)
    server = ServerThread(bodies).start()
    yield RunningGateway(url=server.url, settings=settings, app=app, fake=fake), bodies
    server.stop()
    fake.state.responder = None


def test_claude_code_reads_large_files_through_the_gateway(claude: Path, gateway: tuple[RunningGateway, ClientBodies],
                                                           tmp_path: Path) -> None:
    running, client_bodies = gateway
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    paths = []
    for number in range(FILES):
        path = work / f"module{number}.py"
        path.write_text("".join(f"def f{number}_{i}(x):\n    return x * {i}  # helper {i} of module {number}\n"
                                for i in range(200)))
        paths.append(path)
    running.fake.state.responder = agent(paths)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": running.url,
           "ANTHROPIC_API_KEY": TENANT_KEY, "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    done = subprocess.run([str(claude), "-p", "Read every module in this folder and summarise them.",
                           "--allowedTools", "Read", "Bash"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert FINAL in done.stdout
    upstream = [r["body"] for r in running.fake.requests if r.get("path") == "/v1/messages"]
    loop = [b for b in upstream if any(t.get("name") == "Read" for t in b.get("tools") or [])]
    assert len(loop) == FILES + 1
    for body in upstream:
        assert_valid_anthropic_request(body)
    # What Claude Code sent: each Read result, as it sent it.
    sent = {}
    for body in client_bodies.bodies:
        for message in body["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block.get("type") == "tool_result" and block["tool_use_id"].startswith("toolu_r"):
                    sent[block["tool_use_id"]] = block["content"]
    assert len(sent) == FILES
    # By the last request the early files are memories naming their artifacts.
    forwarded = {b["tool_use_id"]: b["content"] for m in loop[-1]["messages"] if isinstance(m["content"], list)
                 for b in m["content"] if b.get("type") == "tool_result"}
    assert forwarded[f"toolu_r{FILES - 1:02d}"] == sent[f"toolu_r{FILES - 1:02d}"]  # the latest: verbatim
    artifacts = {}
    for number in range(FILES - 1):
        memory = forwarded[f"toolu_r{number:02d}"]
        assert isinstance(memory, str) and memory.startswith("[compacted artifact:art_"), memory[:80]
        artifacts[f"toolu_r{number:02d}"] = memory.split("artifact:")[1].split(";")[0]
    # Tool-result bytes forwarded over the whole session, against a plain replay of them.
    def result_bytes(bodies: list[dict[str, Any]]) -> int:
        return sum(len(json.dumps(b["content"])) for body in bodies for m in body["messages"]
                   if isinstance(m["content"], list) for b in m["content"] if b.get("type") == "tool_result")

    replayed = [b for b in client_bodies.bodies if any(t.get("name") == "Read" for t in b.get("tools") or [])]
    ratio = result_bytes(loop) / result_bytes(replayed)
    print(f"claude code: {len(loop)} agent requests, tool-result bytes forwarded {ratio:.3f} of a plain replay")
    assert ratio <= 0.6, ratio
    # Each file is served back exactly as Claude Code sent it.
    with running.client() as http:
        for call_id, artifact in artifacts.items():
            content = sent[call_id]
            raw = http.get(f"/api/artifacts/{artifact}").content
            assert raw == (content.encode() if isinstance(content, str) else raw)
            if not isinstance(content, str):
                assert json.loads(raw) == content
