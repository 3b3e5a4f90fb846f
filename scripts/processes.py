"""Real processes for the hunting scripts: the fake upstream, the gateway, a fresh PostgreSQL schema.

The gateway runs as `gateway serve` in its own process group, exactly as a user
starts it, so it can be killed with SIGKILL and started again on the same
database.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import sqlalchemy
import yaml

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
POSTGRES_URL = os.environ.get("GATEWAY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
TENANT_KEY = "sk-acme-1"
OTHER_KEY = "sk-globex-1"
ADMIN_KEY = "sk-admin"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "04": "FIN_WAIT1", "05": "FIN_WAIT2", "06": "TIME_WAIT",
               "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


def open_fds(pid: int) -> int:
    """How many file descriptors a process holds (Linux: /proc/<pid>/fd)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def sockets_to(pid: int, port: int) -> dict[str, int]:
    """The TCP sockets a process holds whose peer is on `port`, counted by state (ESTABLISHED,
    CLOSE_WAIT, ...): /proc/<pid>/fd names each socket's inode, /proc/<pid>/net/tcp{,6} its peer and state."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    counts: dict[str, int] = {}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes and int(fields[2].rsplit(":", 1)[1], 16) == port:
                state = _TCP_STATES.get(fields[3], fields[3])
                counts[state] = counts.get(state, 0) + 1
    return counts


def wait_until_up(url: str, seconds: float = 60.0, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up in {seconds} s")


@contextmanager
def postgres_schema(base_url: str = POSTGRES_URL) -> Iterator[str]:
    """A fresh schema on the PostgreSQL server, dropped afterwards; yields its URL."""
    schema = f"hunt_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(base_url)
    with admin.begin() as conn:
        conn.execute(sqlalchemy.text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in base_url else "?"
    try:
        yield f"{base_url}{separator}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(sqlalchemy.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@contextmanager
def fake_upstream(delay: float = 0.0) -> Iterator[str]:
    """`gateway fake-upstream --plain` on a free port; yields its base URL (without /v1)."""
    port = free_port()
    process = subprocess.Popen([PYTHON, "-m", "gateway", "fake-upstream", "--plain", "--port", str(port),
                                "--delay", str(delay)], cwd=REPO, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{url}/v1/models", process=process)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)


def write_config(folder: Path, storage_url: str, upstream: str, **server: Any) -> Path:
    config = {
        "models": [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": f"{upstream}/v1",
                                                        "api_key": "sk-upstream"}},
                   {"name": "claude-*", "litellm_params": {"model": "anthropic/claude-*", "api_base": upstream,
                                                            "api_key": "sk-upstream"}}],
        "tenants": [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "coding-agent"},
                    {"id": "globex", "api_keys": [OTHER_KEY], "policy": "default"}],
        "admin_keys": [ADMIN_KEY],
        "storage": {"url": storage_url, "blob_dir": str(folder / "blobs"), "inline_max_bytes": 2048},
        "server": {"heartbeat_seconds": 0.5, "upstream_timeout_seconds": 30, **server},
        "log_level": "warning",
    }
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Gateway:
    """`gateway serve` as a child process that can be killed and started again."""

    config: Path
    port: int
    log: Path
    process: subprocess.Popen | None = None
    workers: int = 1
    env: dict[str, str] | None = None  # the process's environment (default: this one's)
    ready_seconds: float = 60.0  # how long `start` waits for /readyz
    errors: Path | None = None  # where stderr goes, apart from stdout (default: into `log` with it)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, seconds: float | None = None) -> "Gateway":
        """Start the process and wait up to `seconds` (default `ready_seconds`) until it is ready."""
        with self.log.open("ab") as log, (self.errors or self.log).open("ab") as errors:
            self.process = subprocess.Popen(
                [PYTHON, "-m", "gateway.cli", "serve", "--config", str(self.config), "--port", str(self.port),
                 "--workers", str(self.workers)],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT if self.errors is None else errors,
                start_new_session=True,
                env={**(os.environ if self.env is None else self.env), "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
        try:
            wait_until_up(f"{self.url}/readyz", self.ready_seconds if seconds is None else seconds,
                          process=self.process)
        except BaseException:
            self.stop()  # one that did not come up in time is not left running
            raise
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as when a machine is lost."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class RedisServer:
    """A redis-server of our own (never the shared one), on `port`, holding nothing on disk: it can be
    killed, frozen and started again on the same port."""

    port: int
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        self.process = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                         "--save", "", "--appendonly", "no"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not come up")

    def kill(self) -> None:
        """SIGKILL: what it held is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def freeze(self, frozen: bool = True) -> None:
        """SIGSTOP (it keeps its connections and data but answers nothing), or SIGCONT."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)


def print_report(report: dict[str, Any], ok: bool, as_json: bool) -> int:
    """Print a campaign's figures (one JSON line, or a column), then PASS or FAIL; the exit code."""
    if as_json:
        print(json.dumps({**report, "pass": ok}))
    else:
        width = max(len(key) for key in report)
        for key, value in report.items():
            print(f"{key:>{width}}: {value}")
        print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def load_trace(name: str) -> dict[str, Any]:
    path = REPO / "tests" / "data" / "traces" / name
    return json.loads(path.read_text(encoding="utf-8").splitlines()[0])


def trace_turns(messages: list[dict[str, Any]]) -> list[int]:
    """The request lengths an agent sends replaying `messages`: one before each assistant message."""
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]
