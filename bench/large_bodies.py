"""Heavy and slow clients against one `gateway serve` process: memory, then connections.

    .venv/bin/python bench/large_bodies.py [--clients 50] [--body-mb 3] [--rounds 2] [--settle-seconds 20]
                                           [--slow-clients 3000] [--header-timeout 5] [--json]

`gateway serve` (SQLite, the `coding-agent` policy) in front of the fake upstream (`gateway fake-upstream --plain`).

Memory: the gateway's RSS (VmRSS of its process) after start and one small request (baseline); the highest
sampled while `--clients` concurrent chat requests each carry a transcript of `--body-mb` MB of tool
results (every client its own conversation, 40 tool rounds), `--rounds` times over; and after the burst,
once `--settle-seconds` have passed (the lowest sample in the last 5 s of that wait).

Slow clients: `--slow-clients` sockets each send `POST /v1/chat/completions HTTP/1.1\\r\\nHost: x\\r\\n` and
nothing more; while they are held (the gateway's `gateway_open_connections` says how many), five normal
requests are timed one after the other (ms each), then how long the gateway held each socket (its
`server.header_timeout_seconds` is `--header-timeout`) and the descriptors it holds before, while
and after.
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import select
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_burst import RssSampler  # noqa: E402
from scripts.processes import TENANT_KEY, Gateway, fake_upstream, free_port, open_fds, write_config  # noqa: E402

ROUNDS_PER_TRANSCRIPT = 40
HALF_HEADERS = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
_WORDS = ("error", "build", "src/main.rs", "warning", "line", "function", "return", "value", "test", "passed",
          "failed", "cargo", "module", "struct", "impl", "let", "match", "Some", "None", "Ok", "Err", "0x1f",
          "42", "unused", "variable", "compiling", "finished", "target", "debug", "release")


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) / 1024


def transcript(seed: int, megabytes: float) -> dict[str, Any]:
    """A chat request whose transcript holds ROUNDS_PER_TRANSCRIPT tool rounds, `megabytes` MB of results."""
    rng = random.Random(seed)
    per_result = int(megabytes * 1024 * 1024 / ROUNDS_PER_TRANSCRIPT)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": f"conversation {seed}: fix the build"}]
    for round_ in range(ROUNDS_PER_TRANSCRIPT):
        call = f"call_{seed}_{round_}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function", "function": {"name": "run", "arguments": json.dumps({"n": round_})}}]})
        words: list[str] = []
        size = 0
        while size < per_result:
            word = rng.choice(_WORDS)
            words.append(word)
            size += len(word) + 1
        messages.append({"role": "tool", "tool_call_id": call, "content": " ".join(words)})
    return {"model": "fake", "messages": messages}


def _config(folder: Path, upstream: str, header_timeout: float) -> Path:
    path = write_config(folder, f"sqlite:///{folder / 'gateway.db'}", upstream)
    config = yaml.safe_load(path.read_text())
    config["server"].update(header_timeout_seconds=header_timeout, max_connections=10_000)
    path.write_text(yaml.safe_dump(config))
    return path


def memory(gateway: Gateway, clients: int, megabytes: float, rounds: int, settle: float) -> dict[str, Any]:
    pid = gateway.process.pid
    headers = {"authorization": f"Bearer {TENANT_KEY}"}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=600) as http:
        http.post("/v1/chat/completions", json=transcript(-1, 0.01)).raise_for_status()
    time.sleep(1)
    baseline = rss_mb(pid)
    bodies = [json.dumps(transcript(seed, megabytes)).encode() for seed in range(clients)]
    statuses: dict[str, int] = {}

    def one(body: bytes) -> None:
        with httpx.Client(base_url=gateway.url, headers={**headers, "content-type": "application/json"},
                          timeout=600) as http:
            try:
                status = str(http.post("/v1/chat/completions", content=body).status_code)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            statuses[status] = statuses.get(status, 0) + 1

    began = time.monotonic()
    with RssSampler(lambda: rss_mb(pid), every=0.05) as sampler:
        for round_ in range(rounds):
            # each round new conversations: the second round's transcripts extend the first's
            if round_:
                bodies = [json.dumps(transcript(seed + 1000 * round_, megabytes)).encode() for seed in range(clients)]
            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(one, bodies))
        burst_seconds = time.monotonic() - began
        bodies.clear()
        time.sleep(settle)
    tail = [value for moment, value in sampler.samples if moment >= sampler.samples[-1][0] - 5]
    return {"clients": clients, "body_mb": megabytes, "rounds": rounds, "statuses": statuses,
            "burst_seconds": round(burst_seconds, 1), "rss_baseline_mb": round(baseline, 1),
            "rss_peak_mb": round(sampler.peak(), 1), "rss_after_mb": round(min(tail), 1),
            "settle_seconds": settle}


def _normal_request_ms(url: str) -> float:
    body = {"model": "fake", "messages": [{"role": "user", "content": "hello"}]}
    began = time.monotonic()
    response = httpx.post(f"{url}/v1/chat/completions", json=body,
                          headers={"authorization": f"Bearer {TENANT_KEY}"}, timeout=30)
    response.raise_for_status()
    return (time.monotonic() - began) * 1000


def _gauge(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(f"{name} ")))


def slow_clients(gateway: Gateway, count: int, header_timeout: float) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 1024)), hard))
    pid = gateway.process.pid
    _normal_request_ms(gateway.url)
    fds_before = open_fds(pid)
    opened: dict[int, tuple[socket.socket, float]] = {}
    began = time.monotonic()
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
        sock.sendall(HALF_HEADERS)
        opened[sock.fileno()] = (sock, time.monotonic())
    open_seconds = time.monotonic() - began
    latencies = [_normal_request_ms(gateway.url) for _ in range(5)]
    held = _gauge(gateway.url, "gateway_open_connections") - 1  # not the one asking
    fds_held = open_fds(pid)
    # how long each was held: until the gateway closed (EOF) or reset it
    dropped_after: list[float] = []
    poller = select.poll()
    for fd in opened:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    deadline = time.monotonic() + header_timeout + 60
    while opened and time.monotonic() < deadline:
        for fd, _ in poller.poll(200):
            if fd in opened:
                poller.unregister(fd)
                sock, at = opened.pop(fd)
                dropped_after.append(time.monotonic() - at)
                sock.close()
    still_held = len(opened)
    for sock, _ in opened.values():
        sock.close()
    time.sleep(1)
    dropped_after.sort()
    return {"slow_clients": count, "opened_in_seconds": round(open_seconds, 2),
            "held_by_gateway": int(held), "header_timeout_seconds": header_timeout,
            "normal_request_ms": [round(value, 1) for value in latencies],
            "dropped": len(dropped_after), "still_held_after_60s": still_held,
            "held_seconds_min_median_max": [round(dropped_after[i], 2) for i in
                                            (0, len(dropped_after) // 2, -1)] if dropped_after else None,
            "gateway_fds_before_while_after": [fds_before, fds_held, open_fds(pid)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--body-mb", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settle-seconds", type=float, default=20.0)
    parser.add_argument("--slow-clients", type=int, default=3000)
    parser.add_argument("--header-timeout", type=float, default=5.0)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-slow", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, fake_upstream() as upstream:
        folder = Path(tmp)
        gateway = Gateway(_config(folder, upstream, args.header_timeout), free_port(), folder / "gateway.log")
        gateway.ready_seconds = 300
        gateway.start()
        try:
            if not args.skip_memory:
                report["memory"] = memory(gateway, args.clients, args.body_mb, args.rounds, args.settle_seconds)
            if not args.skip_slow:
                report["slow_clients"] = slow_clients(gateway, args.slow_clients, args.header_timeout)
        finally:
            gateway.stop()
    if args.json:
        print(json.dumps(report))
    else:
        for part, figures in report.items():
            print(part)
            for key, value in figures.items():
                print(f"  {key:>30}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
