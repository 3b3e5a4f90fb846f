"""Added latency, throughput, startup and memory: this gateway against the floor and LiteLLM Proxy, in one run.

    .venv/bin/python bench/proxy_compare.py --quick                  # smoke run, ~1-2 min
    .venv/bin/python bench/proxy_compare.py --litellm-proxy          # the comparison, ~25 min (--no-burst: ~10)
    .venv/bin/python bench/proxy_compare.py --litellm-proxy --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test

Every server is its own process on its own port on 127.0.0.1, against the
constant-time upstream of bench/constant_upstream.py (which answers at once,
so whatever a proxy adds is the proxy):
  direct                        the upstream itself: the baseline (its row is the noise floor);
  floor                         bench/floor_forwarder.py, a bare forwarder (Starlette under uvicorn, one pooled
                                keep-alive httpx client, the body passed on unparsed): the least a Python proxy
                                in front of the upstream adds on this machine, the limit of every figure; in
                                every run, whatever --targets says;
  floor-durable                 the same, committing one small row of each request to a SQLite file (WAL,
                                synchronous=FULL, as the gateway's store) before forwarding it: the least a proxy
                                that records each request before it goes on adds here; in every run too;
  litellm-proxy                 LiteLLM Proxy 1.108.7 (--litellm-proxy), no database, a master key,
                                from its own venv at bench/.litellm-proxy-venv (pip-installed if missing);
  gateway-<policy>-<storage>    `gateway serve`, policies passthrough and coding-agent, on a fresh
                                SQLite file, and on a fresh PostgreSQL schema with --postgres URL.
Each gateway, proxy and floor gets a fresh process (and database) per transcript, one worker unless --workers N.

Transcripts (each request carries the whole of it, as agents send it, `model: fake`):
synthetic coding-agent sessions of 100 and 1,000 messages (read_file, grep,
pytest, edit and git rounds with outputs of a few hundred to a few thousand
characters, from --seed), and the first 99 messages of the OpenHands trace
tests/data/traces/openhands_codeact_llama4-maverick_ponyc-4588.jsonl. Requests
alternate between the transcript as it is and the transcript plus one tool round
never seen before, so the gateway captures on every other request.

Per target and transcript:
  added      interleaved sequential pairs (one direct, one through the target, the order
             flipped every other pair): median of target - direct; p95 and p99 of the
             target's own latency (--requests after --warmup);
  load       20 and 50 concurrent keep-alive clients for --duration seconds after a short
             warmup: requests/s and p95; any non-200 answer or transport error is an error.
             The targets of a transcript are all up during the loads and take turns, in
             --load-windows windows (in order, then in reverse, ...): on a shared machine whose
             speed drifts by 10-20% from minute to minute, and against a proxy whose throughput
             swings between 5-second windows, rows measured minutes apart do not compare;
             and the target's CPU time (user + system, its process tree's, from /proc) over the
             measured windows per request answered: a Python process held to one CPU by the GIL
             serves at most 1000 / that many requests a second, so this is what a figure of
             throughput comes down to (and it drifts with the machine less than requests/s);
  startup    spawn until the first successful chat completion;
  RSS        VmRSS of the process and its children after the load, once every target has been idle
             for --rss-settle (3 s; --quick 1): what a process keeps, not what it frees a moment later
             (the gateway trims the C heap after 2 s without a request); `rss_loaded_mb` in the JSON is
             the reading right at the load's end;
  burst      then, each target in turn (the others idle), --burst-clients (8) chat requests at once,
             each its own conversation of 40 tool rounds whose body is at most --burst-mb MiB
             (30 MiB = 31,457,280 bytes, under the gateway's 32 MiB server.max_body_bytes; the
             bodies of bench/memory_burst.py, built once for the run), every request bounded by
             --burst-timeout; RSS (process and children) sampled every 100 ms: the peak during the
             burst and its --burst-settle (10 s) wait, and after it, the lowest sample of the wait's
             last 5 s (its last half when shorter); the seconds until the last answer; any answer but
             a 200 chat completion is an error (the first one kept). --no-burst skips it; --quick
             sends 2 bodies of 5 MiB and waits 4 s. On 2 CPUs the gateway (coding-agent) takes about
             a minute over the 8 x 30 MiB (51 s on 2026-12-03; its policy reads every line of every
             tool result: about 5 s for one such body alone), the other targets seconds.
The load generator runs in this process, on the same CPUs as the servers.
Prints one table, the gateway (coding-agent, on SQLite and on PostgreSQL) against the
floor and the durable floor (added latency, requests/s and RSS, as ratios: how far from the limit) and, with
LiteLLM Proxy, the gateway (coding-agent, SQLite) against it (latency, throughput, and
RSS after the load, at the burst's peak and after the burst: `rss_ratio`,
`rss_burst_peak_ratio`, `rss_after_burst_ratio`); where both synthetic transcripts ran, every
target's 1,000-message figures over its 100-message ones (`long_vs_short`: added latency and CPU
per request, the floor's and LiteLLM Proxy's beside the gateway's); writes every figure to --json
(default bench/results/proxy_compare.json).
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import itertools
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, NamedTuple

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_transcripts import Transcript, build_transcripts  # noqa: E402
from memory_burst import MIB, burst, burst_bodies, rss_comparison  # noqa: E402
from scripts.processes import free_port, postgres_schema  # noqa: E402

BENCH = REPO / "bench"
# `gateway` as a module of this checkout (the command runs in REPO): the console script of an editable
# install imports the checkout it was installed from, whichever checkout runs this benchmark.
GATEWAY = [sys.executable, "-m", "gateway"]
LITELLM_VERSION = "1.108.7"
LITELLM_VENV = BENCH / ".litellm-proxy-venv"
TENANT_KEY = "sk-acme-1"
UPSTREAM_KEY = "sk-upstream"
LITELLM_MASTER_KEY = "sk-bench-master"
CONCURRENCY = (20, 50)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PING = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "ping"}]}).encode()
# Children talk to 127.0.0.1 only: never through a proxy from the environment.
CHILD_ENV = {**{k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")},
             "NO_PROXY": "127.0.0.1,localhost", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


# --- servers ----------------------------------------------------------------

@dataclass
class Server:
    """A server process in its own process group, and how to call it."""

    name: str
    command: list[str]
    port: int
    api_key: str
    log: Path
    env: dict[str, str] = field(default_factory=lambda: dict(CHILD_ENV))
    process: subprocess.Popen | None = None
    startup_s: float = math.nan

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def headers(self) -> dict[str, str]:
        return {"content-type": "application/json", "authorization": f"Bearer {self.api_key}"}

    def start(self, timeout: float) -> "Server":
        """Spawn, then time until the first successful chat completion."""
        started = time.monotonic()
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)
        with httpx.Client(base_url=self.api_base, headers=self.headers, timeout=5, trust_env=False) as client:
            while time.monotonic() - started < timeout:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
                try:
                    if client.post("/chat/completions", content=PING).status_code == 200:
                        self.startup_s = time.monotonic() - started
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} answered no chat completion in {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        except ProcessLookupError:
            pass

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _tree(self) -> list[int]:
        """The process and all its descendants (empty once it has exited)."""
        if self.process is None or self.process.poll() is not None:
            return []
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(parent, []).append(int(entry.name))
        found, todo = [], [self.process.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found

    def _over_tree(self, read: Callable[[int], float]) -> float:
        """`read(pid)` summed over the process and its descendants (a process gone meanwhile counts 0);
        NaN once the process has exited (not a 0 that reads as a figure)."""
        tree = self._tree()
        if not tree:
            return math.nan
        total = 0.0
        for pid in tree:
            try:
                total += read(pid)
            except (OSError, IndexError, ValueError):
                continue
        return total

    def rss_mb(self) -> float:
        """VmRSS of the process and all its descendants."""
        def vm_rss_kb(pid: int) -> float:
            status = Path(f"/proc/{pid}/status").read_text()
            return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        return self._over_tree(vm_rss_kb) / 1024

    def cpu_seconds(self) -> float:
        """User and system CPU time the process and its descendants have used."""
        def cpu_ticks(pid: int) -> float:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])  # utime, stime
        return self._over_tree(cpu_ticks) / CLOCK_TICKS


def upstream_server(folder: Path) -> Server:
    port = free_port()
    return Server("direct", [sys.executable, str(BENCH / "constant_upstream.py"), "--port", str(port)],
                  port, UPSTREAM_KEY, folder / "upstream.log")


@contextmanager
def floor_server(upstream: Server, workers: int, folder: Path, durable: bool = False) -> Iterator[Server]:
    """bench/floor_forwarder.py in front of the upstream, with the gateway's worker count; `durable`: the
    durable floor, on a SQLite file in `folder` (the row's own, fresh)."""
    port = free_port()
    name = "floor-durable" if durable else "floor"
    command = [sys.executable, str(BENCH / "floor_forwarder.py"), "--upstream", upstream.api_base,
               "--port", str(port), "--workers", str(workers)]
    if durable:
        command += ["--durable", str(folder / "floor-durable.db")]
    yield Server(name, command, port, TENANT_KEY, folder / f"{name}.log")


def gateway_accepts_workers() -> bool:
    result = subprocess.run([*GATEWAY, "serve", "--help"], capture_output=True, text=True, cwd=REPO,
                            env=CHILD_ENV, timeout=120)
    return "--workers" in result.stdout


@contextmanager
def gateway_server(policy: str, storage_url: str | None, upstream: Server, workers: int,
                   folder: Path) -> Iterator[Server]:
    """`gateway serve` on a fresh SQLite file (storage_url None) or a fresh schema of that PostgreSQL."""
    with postgres_schema(storage_url) if storage_url else nullcontext(f"sqlite:///{folder / 'gateway.db'}") as url:
        port = free_port()
        config = {
            "models": [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": upstream.api_base,
                                                            "api_key": "x"}}],
            "tenants": [{"id": "acme", "api_keys": [TENANT_KEY], "policy": policy}],
            "storage": {"url": url, "blob_dir": str(folder / "blobs")},
            "server": {"host": "127.0.0.1", "port": port},
            "log_level": "warning",
        }
        path = folder / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        command = [*GATEWAY, "serve", "--config", str(path), "--port", str(port)]
        if workers > 1:
            command += ["--workers", str(workers)]
        yield Server("gateway", command, port, TENANT_KEY, folder / "gateway.log")


def litellm_proxy_installed() -> bool:
    python = LITELLM_VENV / "bin" / "python"
    if not (LITELLM_VENV / "bin" / "litellm").exists():
        return False
    check = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                           capture_output=True, text=True)
    return check.stdout.strip() == LITELLM_VERSION


def install_litellm_proxy() -> str | None:
    """Create bench/.litellm-proxy-venv with litellm[proxy] pinned, unless there; None, or why it failed."""
    if litellm_proxy_installed():
        return None
    print(f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV.relative_to(REPO)} ...", flush=True)
    steps = [[sys.executable, "-m", "venv", str(LITELLM_VENV)],
             [str(LITELLM_VENV / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
              f"litellm[proxy]=={LITELLM_VERSION}"]]
    for step in steps:
        try:
            result = subprocess.run(step, capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired:
            return f"`{shlex.join(step)}` took over 30 minutes"
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            return f"`{shlex.join(step)}` failed ({result.returncode}):\n{tail}"
    return None if litellm_proxy_installed() else "installed, but `litellm` is missing or the wrong version"


@contextmanager
def litellm_server(upstream: Server, workers: int, folder: Path) -> Iterator[Server]:
    """LiteLLM Proxy with no database (no DATABASE_URL), a master key and the local price map."""
    port = free_port()
    config = {
        "model_list": [{"model_name": "fake", "litellm_params": {"model": "openai/fake",
                                                                 "api_base": upstream.api_base, "api_key": "x"}}],
        "general_settings": {"master_key": LITELLM_MASTER_KEY},
        "litellm_settings": {"telemetry": False},
    }
    path = folder / "litellm.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in CHILD_ENV.items() if k not in ("DATABASE_URL", "DIRECT_URL")}
    env.update({"LITELLM_LOG": "ERROR", "DISABLE_ADMIN_UI": "True", "LITELLM_DONT_SHOW_FEEDBACK_BOX": "True"})
    command = [str(LITELLM_VENV / "bin" / "litellm"), "--config", str(path), "--host", "127.0.0.1",
               "--port", str(port), "--num_workers", str(workers)]
    yield Server("litellm-proxy", command, port, LITELLM_MASTER_KEY, folder / "litellm.log", env=env)


@dataclass
class TargetSpec:
    """A row's target: `open(folder)` gives the (not yet started) server, preparing what it needs."""

    name: str
    open: Callable[[Path], ContextManager[Server]]
    startup_timeout: float = 120.0
    shared: bool = False  # the upstream itself: already running, not restarted per row
    always: bool = False  # a row of every run, whatever --targets says (the baseline, the floor)


def target_specs(args: argparse.Namespace, upstream: Server, notes: list[str]) -> list[TargetSpec]:
    """direct and the floor, LiteLLM Proxy with --litellm-proxy, the gateway per storage and policy."""
    specs = [TargetSpec("direct", lambda folder: nullcontext(upstream), shared=True, always=True)]
    if args.litellm_proxy:
        failure = install_litellm_proxy()
        if failure:
            notes.append(f"LiteLLM Proxy skipped: {failure}")
            print(notes[-1], flush=True)
        else:
            specs.append(TargetSpec("litellm-proxy", lambda folder: litellm_server(upstream, args.workers, folder),
                                    startup_timeout=300.0))
            notes.append("LiteLLM Proxy ran without a database (no spend logs, no virtual keys: the master key only); "
                         "the gateway writes every request, its new nodes and artifacts to its database")
    gateway_workers = args.workers
    if args.workers > 1 and not gateway_accepts_workers():
        notes.append(f"`gateway serve --help` lists no --workers: the gateway ran with 1 worker, not {args.workers}")
        print(notes[-1], flush=True)
        gateway_workers = 1
    specs[1:1] = [TargetSpec("floor", lambda folder: floor_server(upstream, gateway_workers, folder), always=True),
                  TargetSpec("floor-durable", lambda folder: floor_server(upstream, gateway_workers, folder, True),
                             always=True)]
    storages: list[tuple[str, str | None]] = [("sqlite", None)] + ([("postgres", args.postgres)] if args.postgres else [])
    for storage, url in storages:
        for policy in ("passthrough", "coding-agent"):
            specs.append(TargetSpec(f"gateway-{policy}-{storage}", lambda folder, p=policy, u=url:
                                    gateway_server(p, u, upstream, gateway_workers, folder)))
    return specs


# --- measurements -----------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (as numpy's default); NaN for no values."""
    if not values:
        return math.nan
    ordered, k = sorted(values), (len(values) - 1) * q / 100
    lo, hi = math.floor(k), min(math.floor(k) + 1, len(values) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def ok_response(response: httpx.Response, stream: bool) -> bool:
    if response.status_code != 200:
        return False
    if stream:
        return response.content.rstrip().endswith(b"data: [DONE]")
    return b'"choices"' in response.content


def timed_ms(client: httpx.Client, body: bytes, stream: bool) -> tuple[float, str | None]:
    """(ms to the last byte, None) or (ms, what went wrong)."""
    start = time.perf_counter()
    try:
        response = client.post("/chat/completions", content=body)
    except httpx.HTTPError as error:
        return (time.perf_counter() - start) * 1000, f"{type(error).__name__}: {error}"
    elapsed = (time.perf_counter() - start) * 1000
    return elapsed, None if ok_response(response, stream) else f"HTTP {response.status_code}: {response.text[:200]}"


def sequential(direct: Server, target: Server, transcript: Transcript, rounds: Iterator[int],
               requests: int, warmup: int) -> dict[str, Any]:
    """Interleaved pairs, the same bytes to both; the order flips every other pair."""
    pairs: list[tuple[float, float, bool]] = []  # (direct ms, target ms, with a new round)
    errors: list[str] = []
    with httpx.Client(base_url=direct.api_base, headers=direct.headers, timeout=120, trust_env=False) as base, \
            httpx.Client(base_url=target.api_base, headers=target.headers, timeout=120, trust_env=False) as via:
        for i in range(warmup + requests):
            body = transcript.body(next(rounds) if i % 2 else None)
            if (i // 2) % 2:
                target_ms, target_error = timed_ms(via, body, transcript.stream)
                direct_ms, direct_error = timed_ms(base, body, transcript.stream)
            else:
                direct_ms, direct_error = timed_ms(base, body, transcript.stream)
                target_ms, target_error = timed_ms(via, body, transcript.stream)
            if direct_error:
                raise RuntimeError(f"the direct upstream failed: {direct_error}")
            if target_error:
                errors.append(target_error)
            elif i >= warmup:
                pairs.append((direct_ms, target_ms, bool(i % 2)))
    added = [t - d for d, t, _ in pairs]
    latency = [t for _, t, _ in pairs]
    return {"pairs": len(pairs), "errors": len(errors), "first_error": errors[0] if errors else None,
            "added_ms": {"median": percentile(added, 50), "p95": percentile(added, 95), "p99": percentile(added, 99),
                         "median_resend": percentile([t - d for d, t, new in pairs if not new], 50),
                         "median_new_round": percentile([t - d for d, t, new in pairs if new], 50)},
            "target_ms": {"median": percentile(latency, 50), "p95": percentile(latency, 95),
                          "p99": percentile(latency, 99)},
            "direct_ms": {"median": percentile([d for d, _, _ in pairs], 50)}}


class Window(NamedTuple):
    """One load window: the latencies of the 200s (ms), the errors, the seconds it took."""

    latencies: list[float]
    errors: list[str]
    seconds: float
    cpu_seconds: float = math.nan  # the target's CPU time (its process tree's) over the window
    client_cpu_seconds: float = math.nan  # this process's (the load generator's) over the window


async def _drive(clients: list[httpx.AsyncClient], transcript: Transcript, rounds: Iterator[int],
                 seconds: float) -> Window:
    """Each client loops, alternating resend / +round, until `seconds` have passed; (ok ms, errors, elapsed)."""
    latencies: list[float] = []
    errors: list[str] = []
    start = time.perf_counter()
    end = start + seconds

    async def one_client(client: httpx.AsyncClient, offset: int) -> None:
        for i in itertools.count(offset):
            if time.perf_counter() >= end:
                return
            body = transcript.body(next(rounds) if i % 2 else None)
            sent = time.perf_counter()
            try:
                response = await client.post("/chat/completions", content=body)
            except httpx.HTTPError as error:
                errors.append(f"{type(error).__name__}: {error}")
                continue
            if ok_response(response, transcript.stream):
                latencies.append((time.perf_counter() - sent) * 1000)
            else:
                errors.append(f"HTTP {response.status_code}: {response.text[:200]}")

    await asyncio.gather(*(one_client(client, n) for n, client in enumerate(clients)))
    return Window(latencies, errors, time.perf_counter() - start)


async def _window(target: Server, transcript: Transcript, rounds: Iterator[int], clients: int, seconds: float,
                  warmup: float) -> Window:
    # One AsyncClient (one keep-alive connection) per simulated client: a shared pool of 50
    # costs httpx several times the CPU per request, CPU the servers on this machine need.
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    pool = [httpx.AsyncClient(base_url=target.api_base, headers=target.headers, timeout=120, limits=one,
                              trust_env=False) for _ in range(clients)]
    try:
        if warmup > 0:
            await _drive(pool, transcript, rounds, warmup)
        cpu, own = target.cpu_seconds(), time.process_time()
        window = await _drive(pool, transcript, rounds, seconds)
        return window._replace(cpu_seconds=target.cpu_seconds() - cpu, client_cpu_seconds=time.process_time() - own)
    finally:
        await asyncio.gather(*(client.aclose() for client in pool))


def load_window(target: Server, transcript: Transcript, rounds: Iterator[int], clients: int, seconds: float,
                warmup: float) -> Window:
    """`clients` concurrent keep-alive clients for `seconds` after `warmup` unmeasured seconds (uvloop when
    installed)."""
    coroutine = _window(target, transcript, rounds, clients, seconds, warmup)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def load_summary(clients: int, windows: list[Window]) -> dict[str, Any]:
    """Throughput and latency over a target's load windows at one concurrency, as one load."""
    latencies = [ms for window in windows for ms in window.latencies]
    errors = [error for window in windows for error in window.errors]
    elapsed = sum(window.seconds for window in windows)
    return {"clients": clients, "seconds": elapsed, "windows": len(windows), "ok": len(latencies),
            "errors": len(errors), "first_error": errors[0] if errors else None,
            "rps": len(latencies) / elapsed if elapsed else math.nan,
            "p50_ms": percentile(latencies, 50), "p95_ms": percentile(latencies, 95),
            "cpu_ms_per_request": cpu_ms_per_request(windows),
            "client_cpu_ms_per_request": cpu_ms_per_request(windows, client=True)}


def cpu_ms_per_request(windows: list[Window], client: bool = False) -> float:
    """The target's CPU time over its windows per request answered (what bounds its requests/s: a
    process that holds the GIL for c ms a request serves at most 1000 / c of them a second); `client`:
    the load generator's own (this process's) instead."""
    answered = sum(len(window.latencies) for window in windows)
    used = sum(window.client_cpu_seconds if client else window.cpu_seconds for window in windows)
    return used * 1000 / answered if answered and not math.isnan(used) else math.nan


def workers_bound(target_cpu: float, client_cpu: float, upstream_cpu: float, cpus: int, workers: int = 2) -> float:
    """The most `workers` processes of a target can serve against one on `cpus` CPUs shared with the load
    generator and the upstream, all CPU-bound: together they serve at most cpus * 1000 / (target + client
    + upstream CPU ms a request) a second, one worker (the GIL holds it to one CPU) at most 1000 / target."""
    total = target_cpu + client_cpu + upstream_cpu
    return min(float(workers), cpus * target_cpu / total) if total > 0 else math.nan  # NaN in: NaN out


def interleaved_loads(servers: dict[str, Server], transcript: Transcript, rounds: Iterator[int],
                      args: argparse.Namespace) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Per target, per concurrency: --duration seconds of load in --load-windows windows, the targets
    taking turns (in order, then in reverse, ...), so a machine that speeds up or slows down during the
    run, or a target's own slow spells, weigh on every target alike. Each target is warmed up before its
    first window at each concurrency. A failed request is counted in its window; a window that raises
    takes its target out of the later turns (the second value: why, by target), and the others go on."""
    loads: dict[str, dict[str, Any]] = {name: {} for name in servers}
    failed: dict[str, str] = {}
    seconds = args.duration / args.load_windows
    for clients in CONCURRENCY:
        windows: dict[str, list[Window]] = {name: [] for name in servers}
        order = list(servers)
        for turn in range(args.load_windows):
            for name in order if turn % 2 == 0 else reversed(order):
                if name in failed:
                    continue
                warmup = args.load_warmup if turn == 0 else 0.0
                try:
                    windows[name].append(load_window(servers[name], transcript, rounds, clients, seconds, warmup))
                except Exception as error:
                    failed[name] = f"load at {clients} clients: {type(error).__name__}: {error}"
        for name in servers:
            if name not in failed:
                loads[name][str(clients)] = load_summary(clients, windows[name])
    return {name: figures for name, figures in loads.items() if name not in failed}, failed


def burst_line(row: dict[str, Any]) -> str:
    """A burst's figures as printed when it ends."""
    error = f"; {row['burst_errors']} errors, first: {row['burst_first_error'][:200]}" if row["burst_errors"] else ""
    return (f"{row['burst_seconds']:.1f} s, RSS {row.get('rss_mb', math.nan):.0f} -> peak "
            f"{row['rss_burst_peak_mb']:.0f} -> {row['rss_after_burst_mb']:.0f} MB{error}")


def measure_transcript(specs: list[TargetSpec], upstream: Server, transcript: Transcript, rounds: Iterator[int],
                       bodies: list[bytes], args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per target: every target started (fresh) and timed sequentially in turn, then all loaded in
    interleaved windows, then their RSS, then (unless `bodies` is empty) each takes the burst of `bodies`
    in turn, the others idle; all stopped at the end. A target that fails is reported, the others still
    run."""
    rows: dict[str, dict[str, Any]] = {}
    servers: dict[str, Server] = {}
    with ExitStack() as stack:
        for spec in specs:
            print(f"{transcript.name} / {spec.name} ...", end=" ", flush=True)
            row = rows[spec.name] = {"target": spec.name, "transcript": transcript.name,
                                     "messages": len(transcript.messages), "body_kib": len(transcript.head) / 1024}
            started = time.monotonic()
            try:
                folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"proxy-compare-{spec.name}-")))
                server = stack.enter_context(spec.open(folder))
                if not spec.shared:
                    stack.callback(_stop, server, row)
                    server.start(spec.startup_timeout)
                row["startup_s"] = server.startup_s
                row["sequential"] = sequential(upstream, server, transcript, rounds, args.requests, args.warmup)
                servers[spec.name] = server
            except Exception as error:
                row["failed"] = f"{type(error).__name__}: {error}"
            row["wall_s"] = time.monotonic() - started
            failed = row.get("failed", "").splitlines()[:1]
            print(f"{row['wall_s']:.0f} s" + "".join(f"  FAILED: {line}" for line in failed), flush=True)
        print(f"{transcript.name} / load, {len(servers)} targets in turn ...", end=" ", flush=True)
        started = time.monotonic()
        loads, failed = interleaved_loads(servers, transcript, rounds, args)
        for name, figures in loads.items():
            rows[name]["load"] = figures
        for name, why in failed.items():
            rows[name]["failed"] = why
        for name, server in servers.items():  # every target that was loaded, a failed load included
            rows[name]["rss_loaded_mb"] = server.rss_mb()
        time.sleep(args.rss_settle)  # every target idle for the same time: what each keeps, not what it frees late
        for name, server in servers.items():
            rows[name]["rss_mb"] = server.rss_mb()
        print(f"{time.monotonic() - started:.0f} s", flush=True)
        if bodies:
            for name, server in servers.items():
                print(f"{transcript.name} / {name} / burst ...", end=" ", flush=True)
                rows[name].update(burst(server.api_base, server.headers, server.rss_mb, bodies,
                                        args.burst_settle, args.burst_timeout))
                print(burst_line(rows[name]), flush=True)
    for row in rows.values():
        row["errors"] = (row.get("sequential", {}).get("errors", 0)
                         + sum(result["errors"] for result in row.get("load", {}).values())
                         + row.get("burst_errors", 0))
        if not row["errors"] and "failed" not in row:
            row.pop("log_tail", None)
    return list(rows.values())


def _stop(server: Server, row: dict[str, Any]) -> None:
    server.stop()
    row["log_tail"] = server.log_tail()


# --- report -----------------------------------------------------------------

COLUMNS = [("transcript", 15), ("target", 29), ("added med", 9), ("p95", 8), ("p99", 8), ("rps@20", 8),
           ("p95@20", 8), ("rps@50", 8), ("p95@50", 8), ("errors", 6), ("startup s", 9), ("RSS MB", 7),
           ("burst s", 7), ("peak MB", 7), ("after MB", 8)]


def row_cells(row: dict[str, Any]) -> list[str]:
    if "failed" in row and "sequential" not in row:
        return [row["transcript"], row["target"], f"FAILED: {row['failed'].splitlines()[0][:80]}"]
    seq, loads = row["sequential"], row.get("load", {})

    def at(clients: int, key: str, digits: int) -> str:
        value = loads.get(str(clients), {}).get(key, math.nan)
        return f"{value:.{digits}f}"

    return [row["transcript"], row["target"], f"{seq['added_ms']['median']:.2f}", f"{seq['target_ms']['p95']:.2f}",
            f"{seq['target_ms']['p99']:.2f}", at(20, "rps", 1), at(20, "p95_ms", 1), at(50, "rps", 1),
            at(50, "p95_ms", 1), str(row["errors"]), f"{row.get('startup_s', math.nan):.2f}",
            f"{row.get('rss_mb', math.nan):.0f}", f"{row.get('burst_seconds', math.nan):.1f}",
            f"{row.get('rss_burst_peak_mb', math.nan):.0f}", f"{row.get('rss_after_burst_mb', math.nan):.0f}"]


def print_table(rows: list[dict[str, Any]]) -> None:
    header = "  ".join(f"{name:<{width}}" if i < 2 else f"{name:>{width}}" for i, (name, width) in enumerate(COLUMNS))
    print(f"\n{header}\n{'-' * len(header)}")
    for row in rows:
        cells = row_cells(row)
        print("  ".join(f"{cell:<{width}}" if i < 2 or len(cells) < len(COLUMNS) else f"{cell:>{width}}"
                        for i, (cell, (_, width)) in enumerate(zip(cells, COLUMNS))))
    print("added med: median of (target - direct) over interleaved pairs; p95/p99: the target's own latency (ms); "
          "rps@N/p95@N: N concurrent clients; errors: non-200 and transport errors, all phases")
    print("RSS MB: VmRSS of the process and its children after the loads; burst s: the burst of large bodies "
          "at once (--burst-clients x --burst-mb), until its last answer; peak MB: the highest RSS sampled "
          "during it and its settle; after MB: the lowest in the settle's last seconds")
    for row in rows:
        if row.get("burst_errors"):
            print(f"BURST ERRORS {row['transcript']} / {row['target']}: {row['burst_errors']} of the burst's "
                  f"requests failed, first: {row['burst_first_error'][:200]}")
    for row in rows:
        if "failed" in row and "sequential" in row:
            print(f"FAILED {row['transcript']} / {row['target']}: {row['failed'].splitlines()[0][:200]}")
    print("\nCPU ms per answered request under load (the process tree's user + system time over the measured "
          "windows; 1000 / it bounds the requests/s of a process the GIL holds to one CPU): @20 / @50 clients")
    print("  (then the load generator's own CPU ms per request, this process's, @20 / @50; and for a gateway, the most "
          f"two workers could serve against one at 20 clients on this machine's {os.cpu_count()} CPUs shared with the "
          "load generator and the upstream: min(2, CPUs x gateway / (gateway + generator + direct's CPU ms)))")
    direct_cpu = {row["transcript"]: row.get("load", {}).get("20", {}).get("cpu_ms_per_request", math.nan)
                  for row in rows if row["target"] == "direct"}
    for row in rows:
        loads = row.get("load", {})
        if loads:
            own = " / ".join(f"{loads.get(str(n), {}).get('client_cpu_ms_per_request', math.nan):.2f}"
                             for n in CONCURRENCY)
            line = (f"  {row['transcript']:<15} {row['target']:<29} "
                    + " / ".join(f"{loads.get(str(n), {}).get('cpu_ms_per_request', math.nan):.2f}" for n in CONCURRENCY)
                    + f"   generator {own}")
            at20 = loads.get("20", {})
            if row["target"].startswith("gateway"):
                bound = workers_bound(at20.get("cpu_ms_per_request", math.nan),
                                      at20.get("client_cpu_ms_per_request", math.nan),
                                      direct_cpu.get(row["transcript"], math.nan), os.cpu_count() or 1)
                line += f"   two workers at most {bound:.2f}x"
            print(line)
    print("\nadded median (ms) by request: resend of the transcript / transcript + 1 new tool round")
    for row in rows:
        added = row.get("sequential", {}).get("added_ms")
        if added:
            print(f"  {row['transcript']:<15} {row['target']:<29} {added['median_resend']:>8.2f} / "
                  f"{added['median_new_round']:.2f}")


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN where the denominator is not above 0 (an added latency within the
    noise can be negative: no ratio then) or not a number."""
    return numerator / denominator if denominator > 0 else math.nan


def measured(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The rows with both the sequential pairs and the loads, by (transcript, target)."""
    return {(row["transcript"], row["target"]): row for row in rows if "sequential" in row and "load" in row}


def comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per transcript: the gateway (coding-agent, SQLite) over LiteLLM Proxy, latency and throughput, and
    RSS after the loads, at the burst's peak and after it settled (the issue asks for an RSS after the
    benchmark at most LiteLLM Proxy's, and within 20% of it after the burst)."""
    found = measured(rows)
    out = []
    for transcript in dict.fromkeys(row["transcript"] for row in rows):
        gateway, litellm = found.get((transcript, "gateway-coding-agent-sqlite")), found.get((transcript, "litellm-proxy"))
        if not gateway or not litellm:
            continue
        g20, l20 = gateway["load"]["20"], litellm["load"]["20"]
        g_added, l_added = gateway["sequential"]["added_ms"]["median"], litellm["sequential"]["added_ms"]["median"]
        out.append({"transcript": transcript, "added_median_ms": {"gateway": g_added, "litellm": l_added},
                    "added_median_ratio": ratio(g_added, l_added),
                    "rps20": {"gateway": g20["rps"], "litellm": l20["rps"]},
                    "rps20_ratio": ratio(g20["rps"], l20["rps"]),
                    "p95_20_ms": {"gateway": g20["p95_ms"], "litellm": l20["p95_ms"]},
                    "p95_20_ratio": ratio(g20["p95_ms"], l20["p95_ms"]),
                    "cpu20_ms": {"gateway": g20.get("cpu_ms_per_request", math.nan),
                                 "litellm": l20.get("cpu_ms_per_request", math.nan)},
                    "cpu20_ratio": ratio(g20.get("cpu_ms_per_request", math.nan),
                                         l20.get("cpu_ms_per_request", math.nan)),
                    **rss_comparison(gateway, litellm, "litellm")})
    return out


def floor_comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per transcript and storage: the gateway (coding-agent) against the floor. The added-latency ratio
    is how many times the floor's added median the gateway adds; the requests/s ratio, at 20 and at 50
    clients, the share of the floor's throughput the gateway keeps (1.0 would be the limit); the RSS
    ratios, how many times the floor's memory the gateway holds after the loads and after the burst. The
    durable floor's added median beside them (`floor_durable`, `added_median_ratio_durable`), where it ran."""
    found = measured(rows)
    out = []
    for transcript in dict.fromkeys(row["transcript"] for row in rows):
        floor = found.get((transcript, "floor"))
        durable = found.get((transcript, "floor-durable"))
        d_added = durable["sequential"]["added_ms"]["median"] if durable else math.nan
        for storage in ("sqlite", "postgres"):
            gateway = found.get((transcript, f"gateway-coding-agent-{storage}"))
            if not gateway or not floor:
                continue
            g_added, f_added = gateway["sequential"]["added_ms"]["median"], floor["sequential"]["added_ms"]["median"]
            comparison = {"transcript": transcript, "gateway": gateway["target"],
                          "added_median_ms": {"gateway": g_added, "floor": f_added, "floor_durable": d_added},
                          "added_median_ratio": ratio(g_added, f_added),
                          "added_median_ratio_durable": ratio(g_added, d_added)}
            for clients in CONCURRENCY:
                g_rps = gateway["load"].get(str(clients), {}).get("rps", math.nan)
                f_rps = floor["load"].get(str(clients), {}).get("rps", math.nan)
                comparison[f"rps{clients}"] = {"gateway": g_rps, "floor": f_rps}
                comparison[f"rps{clients}_ratio"] = ratio(g_rps, f_rps)
            comparison.update(rss_comparison(gateway, floor, "floor"))
            out.append(comparison)
    return out


SHORT, LONG = "synthetic-100", "synthetic-1000"


def scaling_comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target measured on both synthetic transcripts: what a 1,000-message request adds against what
    a 100-message one adds (the issue asks the gateway for at most 2x), and the same for the CPU per
    request at 20 clients; the floor's and LiteLLM Proxy's beside the gateway's, measured in the same
    run, are what a forwarder that reads and writes a body ten times larger pays for it."""
    found = {(row["transcript"], row["target"]): row for row in rows if "sequential" in row}
    out = []
    for target in dict.fromkeys(row["target"] for row in rows):
        short, long = found.get((SHORT, target)), found.get((LONG, target))
        if not short or not long or target == "direct":
            continue
        s_added, l_added = short["sequential"]["added_ms"]["median"], long["sequential"]["added_ms"]["median"]
        s_cpu = short.get("load", {}).get("20", {}).get("cpu_ms_per_request", math.nan)
        l_cpu = long.get("load", {}).get("20", {}).get("cpu_ms_per_request", math.nan)
        out.append({"target": target, "added_median_ms": {SHORT: s_added, LONG: l_added},
                    "added_median_ratio": ratio(l_added, s_added),
                    "cpu20_ms": {SHORT: s_cpu, LONG: l_cpu}, "cpu20_ratio": ratio(l_cpu, s_cpu)})
    return out


def print_scaling(found: list[dict[str, Any]]) -> None:
    if not found:
        return
    print(f"\n1,000 messages against 100: added median {LONG} / {SHORT}; CPU ms/request@20 {LONG} / {SHORT}")
    for c in found:
        added, cpu = c["added_median_ms"], c["cpu20_ms"]
        print(f"  {c['target']:<29} added median {added[LONG]:.2f} / {added[SHORT]:.2f} ms = "
              f"{c['added_median_ratio']:.2f}x;  CPU {cpu[LONG]:.2f} / {cpu[SHORT]:.2f} ms = {c['cpu20_ratio']:.2f}x")


def rss_text(comparison: dict[str, Any], other: str) -> str:
    """The RSS figures of a comparison: gateway / other after the loads, at the burst's peak, settled after it."""
    parts = []
    for label, figure, ratio_name in (("after load", "rss_mb", "rss_ratio"),
                                      ("burst peak", "rss_burst_peak_mb", "rss_burst_peak_ratio"),
                                      ("after burst", "rss_after_burst_mb", "rss_after_burst_ratio")):
        values = comparison[figure]
        parts.append(f"{label} {values['gateway']:.0f} / {values[other]:.0f} = {comparison[ratio_name]:.2f}x")
    return "RSS MB " + ";  ".join(parts)


def print_floor_comparisons(found: list[dict[str, Any]]) -> None:
    if not found:
        return
    print("\ngateway (coding-agent) vs the floor: added median gateway / floor; rps@N gateway / floor; "
          "RSS gateway / floor")
    for c in found:
        rps = ";  ".join(f"rps@{n} {c[f'rps{n}']['gateway']:.1f} / {c[f'rps{n}']['floor']:.1f} = "
                         f"{c[f'rps{n}_ratio']:.2f}x" for n in CONCURRENCY)
        print(f"  {c['transcript']:<15} {c['gateway']:<29} added median {c['added_median_ms']['gateway']:.2f} / "
              f"{c['added_median_ms']['floor']:.2f} ms = {c['added_median_ratio']:.1f}x;  {rps}")
        durable = c["added_median_ms"].get("floor_durable", math.nan)
        if not math.isnan(durable):
            print(f"  {'':<15} {'':<29} the durable floor added {durable:.2f} ms: the gateway adds "
                  f"{c['added_median_ratio_durable']:.1f}x that")
        print(f"  {'':<15} {'':<29} {rss_text(c, 'floor')}")


def print_comparisons(found: list[dict[str, Any]]) -> None:
    if not found:
        return
    print("\ngateway (coding-agent, SQLite) vs LiteLLM Proxy")
    for c in found:
        print(f"  {c['transcript']:<15} added median {c['added_median_ms']['gateway']:.2f} / "
              f"{c['added_median_ms']['litellm']:.2f} ms = {c['added_median_ratio']:.2f}x;  "
              f"rps@20 {c['rps20']['gateway']:.1f} / {c['rps20']['litellm']:.1f} = {c['rps20_ratio']:.2f}x;  "
              f"p95@20 {c['p95_20_ms']['gateway']:.1f} vs {c['p95_20_ms']['litellm']:.1f} ms "
              f"({c['p95_20_ratio']:.2f}x);  CPU ms/request@20 {c['cpu20_ms']['gateway']:.2f} / "
              f"{c['cpu20_ms']['litellm']:.2f} = {c['cpu20_ratio']:.2f}x")
        print(f"  {'':<15} {rss_text(c, 'litellm')}")


def finite(value: Any) -> Any:
    """`value` with NaN (a figure that could not be measured) as None, so the JSON is strict."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite(item) for item in value]
    return value


def machine() -> dict[str, Any]:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = {"cpus": cpus, "os_cpu_count": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "gateway_litellm_sdk": importlib.metadata.version("litellm")}
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
        info["cpu_model"] = model
    except (OSError, StopIteration):
        pass
    return info


def build_burst(args: argparse.Namespace) -> tuple[list[bytes], dict[str, Any] | None]:
    """The burst's bodies, built once for every target and transcript (none with --no-burst), and what they are."""
    if args.no_burst:
        return [], None
    started = time.monotonic()
    bodies = burst_bodies(args.burst_clients, round(args.burst_mb * MIB))
    sizes = [len(body) for body in bodies]
    print(f"burst: {len(bodies)} conversations at once, bodies of {min(sizes):,} to {max(sizes):,} bytes "
          f"({args.burst_mb:g} MiB = {round(args.burst_mb * MIB):,} at most; built in "
          f"{time.monotonic() - started:.1f} s), then {args.burst_settle:g} s to settle", flush=True)
    return bodies, {"clients": len(bodies), "mib": args.burst_mb, "body_bytes": sizes,
                    "settle_s": args.burst_settle, "timeout_s": args.burst_timeout}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, help="measured sequential pairs per row (default 200; --quick 20)")
    parser.add_argument("--warmup", type=int, help="unmeasured pairs first (default 20; --quick 4)")
    parser.add_argument("--duration", type=float, help="seconds of load per target and concurrency (default 15; --quick 2)")
    parser.add_argument("--load-warmup", type=float, help="seconds of unmeasured load first (default 2; --quick 0.5)")
    parser.add_argument("--load-windows", type=int, help="windows the --duration is cut into, the targets taking "
                                                         "turns (default 3; --quick 1)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes of each proxy (default 1)")
    parser.add_argument("--litellm-proxy", action="store_true",
                        help=f"also LiteLLM Proxy {LITELLM_VERSION} (installed into {LITELLM_VENV.relative_to(REPO)})")
    parser.add_argument("--postgres", metavar="URL",
                        help="also the gateway on PostgreSQL (a fresh schema per row), "
                             "e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--transcripts", nargs="+", metavar="NAME",
                        help="synthetic-100, synthetic-1000 and/or trace-99 (default all; --quick synthetic-100)")
    parser.add_argument("--targets", nargs="+", metavar="NAME",
                        help="only these rows besides `direct`, `floor` and `floor-durable` (e.g. gateway-coding-agent-sqlite "
                             "litellm-proxy)")
    parser.add_argument("--stream", action="store_true", help="send `stream: true` and time to the last byte")
    parser.add_argument("--seed", type=int, default=7, help="of the synthetic transcripts (default 7)")
    parser.add_argument("--burst-clients", type=int, help="requests of the burst, all at once (default 8; --quick 2)")
    parser.add_argument("--burst-mb", type=float,
                        help="MiB (2^20 bytes) of each burst body, at most (default 30; --quick 5); the gateway "
                             "refuses bodies over server.max_body_bytes, 32 MiB (400 request_too_large), and "
                             "answers 503 server_busy past server.max_buffered_request_bytes, 256 MiB, of bodies "
                             "held at once")
    parser.add_argument("--burst-settle", type=float,
                        help="seconds of quiet after the burst's last answer before its RSS is read (default 10; "
                             "--quick 4)")
    parser.add_argument("--burst-timeout", type=float, default=600.0,
                        help="seconds each burst request may take in all (default 600, the gateway's "
                             "server.upstream_timeout_seconds)")
    parser.add_argument("--rss-settle", type=float,
                        help="seconds every target is left idle after the loads before its RSS is read "
                             "(default 3; --quick 1)")
    parser.add_argument("--no-burst", action="store_true", help="skip the burst")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few requests, short loads, one transcript")
    parser.add_argument("--json", type=Path, default=BENCH / "results" / "proxy_compare.json",
                        help="write every figure here (default bench/results/proxy_compare.json)")
    args = parser.parse_args()
    defaults = {"requests": (200, 20), "warmup": (20, 4), "duration": (15.0, 2.0), "load_warmup": (2.0, 0.5),
                "load_windows": (3, 1), "burst_clients": (8, 2), "burst_mb": (30.0, 5.0), "burst_settle": (10.0, 4.0),
                "rss_settle": (3.0, 1.0)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.requests < 1 or args.warmup < 0 or args.duration <= 0 or args.load_warmup < 0 or args.workers < 1 \
            or args.load_windows < 1:
        parser.error("--requests, --workers and --load-windows must be >= 1, --duration > 0, --warmup and --load-warmup >= 0")
    if args.burst_clients < 1 or args.burst_mb <= 0 or args.burst_settle < 0 or args.rss_settle < 0 \
            or args.burst_timeout <= 0:
        parser.error("--burst-clients must be >= 1, --burst-mb and --burst-timeout > 0, "
                     "--burst-settle and --rss-settle >= 0")

    command = shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    info = machine()
    print(f"command: {command}")
    print(f"machine: {info['cpus']} CPUs ({info.get('cpu_model', '?')}), python {info['python']} on {info['platform']}; "
          f"the gateway's LiteLLM SDK {info['gateway_litellm_sdk']}")
    transcripts = build_transcripts(args)
    for t in transcripts:
        print(f"transcript {t.name}: {len(t.messages)} messages, {len(t.head) / 1024:.0f} KiB body, "
              f"{len(t.tools)} tool schemas{', streaming' if t.stream else ''}")
    bodies, burst_info = build_burst(args)
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    rounds = itertools.count(1)  # every +round request of the run gets a round never sent before
    with tempfile.TemporaryDirectory(prefix="proxy-compare-") as tmp:
        upstream = upstream_server(Path(tmp))
        try:
            upstream.start(30)
            specs = [spec for spec in target_specs(args, upstream, notes)
                     if spec.always or not args.targets or spec.name in args.targets]
            for transcript in transcripts:
                rows += measure_transcript(specs, upstream, transcript, rounds, bodies, args)
        finally:
            upstream.stop()

    print_table(rows)
    against_floor = floor_comparisons(rows)
    print_floor_comparisons(against_floor)
    found = comparisons(rows)
    print_comparisons(found)
    scaling = scaling_comparisons(rows)
    print_scaling(scaling)
    for note in notes:
        print(f"note: {note}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {"command": command, "machine": info, "options": {k: str(v) if isinstance(v, Path) else v
                                                               for k, v in vars(args).items()},
              "litellm_proxy_version": LITELLM_VERSION if any(r["target"] == "litellm-proxy" for r in rows) else None,
              "burst": burst_info, "rows": rows, "gateway_vs_floor": against_floor, "gateway_vs_litellm": found,
              "long_vs_short": scaling, "notes": notes}
    args.json.write_text(json.dumps(finite(report), indent=2, default=str, allow_nan=False) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
