"""The real Gemini CLI through the gateway, offline, against the fake Gemini upstream.

Gemini CLI (npm `@google/gemini-cli`, pinned in tests/clients/package.json, installed
there by .ci/run) runs `gemini -p PROMPT --yolo --model gemini-2.5-flash` with
GOOGLE_GEMINI_BASE_URL at the gateway, its key as GEMINI_API_KEY, and a temporary
HOME whose .gemini/settings.json selects API-key auth (without it the CLI refuses a
custom base URL in non-interactive mode). The fake upstream plays a Gemini model that
reads several large files with the CLI's own `read_file` tool, one per turn, then
answers. The CLI reads the files itself and sends their contents back through the
gateway, replaying its whole transcript on every turn.
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
from tests.gateway.agents.test_claude_code import ClientBodies
from tests.gateway.wire.test_gemini_api import assert_paired
from testkit.fake_upstream import FakeUpstream, ServerThread

GEMINI = Path(__file__).resolve().parents[2] / "clients" / "node_modules" / ".bin" / "gemini"
MODEL = "gemini-2.5-flash"
PATH = f"/v1beta/models/{MODEL}:streamGenerateContent"
FINAL = "Read all six modules."
LINES = "\n".join(f"def function_{i}(argument):  # line {i} of a module the agent reads whole" for i in range(160))


def model(paths: list[Path]) -> Any:
    """The scripted Gemini model: read the next file with the CLI's read_file tool, then answer."""

    def respond(body: dict[str, Any]) -> Step:
        offered = {d.get("name") for t in body.get("tools") or [] for d in t.get("functionDeclarations") or []}
        if "read_file" not in offered:
            return Step(message={"role": "assistant", "content": "ok"})  # a side request
        done = sum(1 for c in body["contents"] for p in c["parts"]
                   if (p.get("functionResponse") or {}).get("name") == "read_file")
        if done < len(paths):
            return Step(parts=[{"text": f"Reading module {done}."},
                               {"functionCall": {"name": "read_file", "args": {"file_path": str(paths[done])}}}])
        return Step(message={"role": "assistant", "content": FINAL})

    return respond


@pytest.fixture
def gemini() -> Path:
    return installed(GEMINI, "`npm install --prefix tests/clients` installs the pinned Gemini CLI")


@pytest.fixture
def gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[tuple[RunningGateway, ClientBodies]]:
    models = [{"name": "gemini-*", "litellm_params": {"model": "gemini/gemini-*", "api_base": f"{fake.url}/v1beta",
                                                       "api_key": "upstream-key"}}]
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "coding-agent"}]
    settings = settings_for(fake.api_base, sqlite_url, tmp_path, models=models, tenants=tenants)
    app = create_app(settings)
    bodies = ClientBodies(app, path=PATH)
    server = ServerThread(bodies).start()
    yield RunningGateway(url=server.url, settings=settings, app=app, fake=fake), bodies
    server.stop()
    fake.state.gemini_responder = None


def gemini_home(home: Path) -> None:
    """A HOME whose settings select API-key auth and send no usage statistics."""
    (home / ".gemini").mkdir(parents=True)
    settings = {"security": {"auth": {"selectedType": "gemini-api-key"}},
                "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))


def response_bytes(bodies: list[dict[str, Any]]) -> int:
    return sum(len(json.dumps(p["functionResponse"]["response"])) for body in bodies for c in body["contents"]
               for p in c["parts"] if "functionResponse" in p)


def test_gemini_cli_reads_files_through_the_gateway(gemini: Path, gateway: tuple[RunningGateway, ClientBodies],
                                                    tmp_path: Path) -> None:
    running, client_bodies = gateway
    home, work = tmp_path / "home", tmp_path / "work"
    gemini_home(home)
    work.mkdir()
    paths = [work / f"module_{n}.py" for n in range(6)]
    for number, path in enumerate(paths):
        path.write_text(f"# module {number}\n{LINES}\n")
    running.fake.state.gemini_responder = model(paths)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "GOOGLE_GEMINI_BASE_URL": running.url,
           "GEMINI_API_KEY": TENANT_KEY, "GEMINI_CLI_TRUST_WORKSPACE": "true", "NO_COLOR": "1"}
    done = subprocess.run([str(gemini), "-p", "Read the six modules and report.", "--yolo", "--model", MODEL],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert FINAL in done.stdout
    upstream = [r["body"] for r in running.fake.requests if r.get("path", "").startswith("/v1beta/")]
    assert len(upstream) == len(paths) + 1 and len(client_bodies.bodies) == len(upstream)
    for body in upstream:
        assert_paired(body)
    # What the CLI sent: each file's contents as the read_file result, under the ids the CLI made.
    sent = {p["functionResponse"]["id"]: p["functionResponse"]["response"]["output"]
            for c in client_bodies.bodies[-1]["contents"] for p in c["parts"] if "functionResponse" in p}
    assert len(sent) == len(paths)
    forwarded = [p["functionResponse"] for c in upstream[-1]["contents"] for p in c["parts"] if "functionResponse" in p]
    assert forwarded[-1]["response"]["output"] == sent[forwarded[-1]["id"]]  # the latest read verbatim
    artifacts = {}
    for response in forwarded[:-1]:
        memory = response["response"]["output"]
        assert memory.startswith("[compacted artifact:art_"), memory[:80]
        artifacts[response["id"]] = memory.split("artifact:")[1].split(";")[0]
    ratio = response_bytes(upstream) / response_bytes(client_bodies.bodies)
    print(f"gemini cli: {len(upstream)} requests, tool bytes forwarded {ratio:.3f} of a plain replay")
    assert ratio <= 0.6, ratio
    with running.client() as http:
        for call_id, artifact in artifacts.items():
            assert http.get(f"/api/artifacts/{artifact}").content == sent[call_id].encode()
        ids = [r["headers"]["x-client-request-id"] for r in running.fake.requests
               if r.get("path", "").startswith("/v1beta/")]
        runs = [http.get(f"/api/requests/{request_id}").json() for request_id in ids]
    assert [(r["wire_format"], r["status"]) for r in runs] == [("google.gemini", "ok")] * len(upstream)
