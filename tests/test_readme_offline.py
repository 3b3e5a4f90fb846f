"""The README's "Try your agent offline" runs as written: its code blocks, each a real session through the gateway.

The section's fenced blocks are taken from README.md and run: the shell block that starts
`gateway fake-upstream` and `gateway serve --config examples/offline.yaml`, Claude Code's, Codex's and
Gemini CLI's command lines (the real CLIs of tests/clients, on PATH), and the two Python scripts (the openai SDK's
tool loop, the Agents SDK). Only ports and paths change, the same way in every block and in the copy of
examples/offline.yaml the gateway serves: port 4000 and 18080 become free ones (another gateway may be
serving 4000), `.venv/bin/` the bin folder of the Python running the tests, `examples/offline.yaml` the
copy (so its SQLite file lands in the test's folder). Each client runs in a folder of its own, with a
temporary HOME, stdin closed. Each must print the answer the README says, and the gateway's records must
hold its session: every run answered and priced, and the three shell commands' results captured as
artifacts, served back by the records API. The Agents SDK and Anthropic SDK scripts of "Using it from an
agent" run against the same gateway.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from gateway.fake_upstream.agent import AgentScript
from scripts.processes import free_port, wait_until_up
from tests.conftest import TENANT_KEY, installed

REPO = Path(__file__).resolve().parent.parent
CLIENTS = REPO / "tests" / "clients" / "node_modules" / ".bin"
HEADING = "## Try your agent offline"


def section(heading: str = HEADING) -> str:
    """The README's text under `heading`, up to the next heading of the same level or above."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index(f"\n{heading}\n") + 1
    level = heading.split(" ")[0]
    ends = [found for mark in ("\n## ", f"\n{level} ") if (found := readme.find(mark, start + len(heading))) >= 0]
    return readme[start:min(ends)] if ends else readme[start:]


def blocks(heading: str = HEADING) -> list[tuple[str, str]]:
    """(language, code) of every fenced block under the heading, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", section(heading), re.S | re.M)


def block(language: str, marker: str, heading: str = HEADING) -> str:
    found = [code for lang, code in blocks(heading) if lang == language and marker in code]
    assert len(found) == 1, f"one {language} block with {marker!r} under {heading!r}, found {len(found)}"
    return found[0]


def promised_answer() -> str:
    """The answer the section says each client ends with, whitespace as rendered."""
    found = re.search(r"Each ends with `([^`]+)`", section())
    assert found, "the section says what each client prints"
    return " ".join(found.group(1).split())


@dataclass
class Offline:
    folder: Path
    gateway_port: int
    fake_port: int
    config: Path

    def localize(self, text: str) -> str:
        """The README's text with this run's ports and paths (module docstring)."""
        text = re.sub(r"\b4000\b", str(self.gateway_port), text)
        text = re.sub(r"\b18080\b", str(self.fake_port), text)
        text = text.replace(".venv/bin/", f"{Path(sys.executable).parent}/")
        return text.replace("examples/offline.yaml", str(self.config))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def run(self, name: str, argv: list[str], extra_path: Path | None = None) -> str:
        """Run a client in a folder and HOME of its own; its stdout. The folder's path is in `pwd`'s result."""
        work, home = self.folder / name, self.folder / f"home-{name}"
        work.mkdir()
        home.mkdir()
        (work / "notes.txt").write_text("a file for `ls -la` to list\n")
        path = os.environ["PATH"] if extra_path is None else f"{extra_path}{os.pathsep}{os.environ['PATH']}"
        env = {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8"}
        done = subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    def runs(self, wire_format: str, model_like: str) -> list[sqlite3.Row]:
        with sqlite3.connect(self.folder / "offline.db") as db:
            db.row_factory = sqlite3.Row
            return db.execute("SELECT id, status, conversation_id, cost_usd FROM model_runs WHERE wire_format = ? "
                              "AND model LIKE ? ORDER BY started_at", (wire_format, model_like)).fetchall()

    def artifacts(self, run_ids: list[str]) -> list[sqlite3.Row]:
        with sqlite3.connect(self.folder / "offline.db") as db:
            db.row_factory = sqlite3.Row
            marks = ",".join("?" * len(run_ids))
            return db.execute(f"SELECT id, tool_name, captured_by_request FROM tool_artifacts "
                              f"WHERE captured_by_request IN ({marks}) ORDER BY observed_at", run_ids).fetchall()


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Offline]:
    """The section's first block, running: the fake upstream and the gateway on examples/offline.yaml."""
    folder = tmp_path_factory.mktemp("offline")
    setup = Offline(folder, free_port(), free_port(), folder / "offline.yaml")
    setup.config.write_text(setup.localize((REPO / "examples" / "offline.yaml").read_text(encoding="utf-8")))
    start = block("sh", "gateway serve")
    env = {**os.environ, "PYTHONPATH": str(REPO), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    log = (folder / "servers.log").open("w")
    servers = subprocess.Popen(["bash", "-c", setup.localize(start)], cwd=REPO, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_up(f"http://127.0.0.1:{setup.fake_port}/v1/models", 120, servers)
        wait_until_up(f"{setup.url}/healthz", 180, servers)
        yield setup
    finally:
        os.killpg(servers.pid, signal.SIGTERM)
        servers.wait(30)
        log.close()


def assert_session(offline: Offline, wire_format: str, model_like: str, tool: str, work: str) -> None:
    """The gateway recorded the client's session: all runs answered, at least the three tool rounds and
    the answer, and the three commands' results captured as `tool` artifacts (`pwd`'s naming the folder)."""
    runs = offline.runs(wire_format, model_like)
    assert len(runs) >= 4, [dict(r) for r in runs]
    assert {r["status"] for r in runs} == {"ok"}, [dict(r) for r in runs]
    assert all(r["cost_usd"] and r["cost_usd"] > 0 for r in runs)  # the demo prices apply
    artifacts = offline.artifacts([r["id"] for r in runs])
    assert [a["tool_name"] for a in artifacts] == [tool] * 3, [dict(a) for a in artifacts]
    with httpx.Client(base_url=offline.url, headers={"Authorization": f"Bearer {TENANT_KEY}"}, timeout=60) as http:
        contents = [http.get(f"/api/artifacts/{a['id']}").text for a in artifacts]
        record = http.get(f"/api/requests/{artifacts[0]['captured_by_request']}").json()
    assert work in contents[0], contents[0]  # pwd
    assert "notes.txt" in contents[1], contents[1]  # ls -la
    assert os.uname().sysname in contents[2], contents[2]  # uname -s
    assert artifacts[0]["id"] in record["captured_artifact_ids"]


def test_the_section_has_the_blocks_this_test_runs() -> None:
    assert [lang for lang, _ in blocks()] == ["sh", "sh", "sh", "sh", "python", "python", "json"]
    script = AgentScript.parse(json.loads(block("json", "rounds")), "README")  # the documented format parses
    assert [r.shell or r.tool for r in script.rounds] == ["git status --short", "read_file"]


@dataclass(frozen=True)
class Client:
    name: str
    language: str
    marker: str  # what tells its block from the others
    wire_format: str
    model_like: str
    tool: str  # its shell tool
    cli: str | None = None  # the CLI of tests/clients it runs


CLIENTS_RUN = [
    Client("claude", "sh", "claude -p", "anthropic.messages", "claude-%", "Bash", cli="claude"),
    Client("codex", "sh", "codex exec", "openai.responses", "gpt-5.1-codex", "exec_command", cli="codex"),
    Client("gemini", "sh", "gemini -p", "google.gemini", "gemini-%", "run_shell_command", cli="gemini"),
    Client("openai-sdk", "python", "from openai import OpenAI", "openai.chat", "gpt-4.1", "shell_command"),
    Client("agents-sdk", "python", "from agents import", "openai.responses", "gpt-4.1", "shell_command"),
]


@pytest.mark.parametrize("client", CLIENTS_RUN, ids=lambda c: c.name)
def test_each_client_as_the_readme_runs_it(offline: Offline, client: Client) -> None:
    code = offline.localize(block(client.language, client.marker))
    if client.language == "python":
        script = offline.folder / f"{client.name}.py"
        script.write_text(code)
        out = offline.run(client.name, [sys.executable, str(script)])
    else:
        cli = installed(CLIENTS / client.cli, "`npm ci --prefix tests/clients` installs the pinned CLIs")
        out = offline.run(client.name, ["bash", "-c", code], cli.parent)
    assert promised_answer() in " ".join(out.split())
    assert not (offline.folder / f"home-{client.name}" / ".codex").exists()  # Codex kept to its own CODEX_HOME
    assert_session(offline, client.wire_format, client.model_like, client.tool, str(offline.folder / client.name))


@pytest.mark.parametrize(("heading", "marker"), [
    ("### Codex CLI, the OpenAI Agents SDK and the Responses API", "from agents import"),
    ("### Claude Code and the Anthropic SDK", "import anthropic"),
])
def test_the_sdk_scripts_of_using_it_from_an_agent_run_on_the_offline_config(offline: Offline, heading: str,
                                                                              marker: str) -> None:
    """Scripts as they stand: no top-level await, a model examples/offline.yaml has; no tools, so the answer."""
    script = offline.folder / f"{marker.split()[-1]}-snippet.py"
    script.write_text(offline.localize(block("python", marker, heading)))
    out = offline.run(f"{marker.split()[-1]}-snippet", [sys.executable, str(script)])
    assert "Done (the offline fake model): 0 commands ran" in out
