"""Model requests around a Redis outage: answers and latency before, during and after it.

    .venv/bin/python bench/redis_outage.py [--how kill|freeze] [--when-down local|refuse] [--clients 10]
                                           [--phase-seconds 4] [--json]

`gateway serve` (SQLite, a tenant with a rate limit and a budget, so every request reads and writes
Redis) in front of the fake upstream, and a redis-server of its own on a free port. After one phase
Redis is killed (`kill`: connections refused; it comes back empty) or frozen with SIGSTOP (`freeze`:
nothing answers; it comes back with its data), for one phase; then it is back for one phase. For each
phase, by the time a request was sent: answers by status, and latency p50 / p99 / max in ms.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.processes import TENANT_KEY, Gateway, RedisServer, fake_upstream, free_port, write_config  # noqa: E402

PHASES = ("before", "during", "after")


def _config(folder: Path, upstream: str, redis_url: str, when_down: str) -> Path:
    path = write_config(folder, f"sqlite:///{folder / 'gateway.db'}", upstream)
    config = yaml.safe_load(path.read_text())
    config["models"][0]["litellm_params"].update(input_cost_per_token=0.001, output_cost_per_token=0.001)
    config["tenants"][0].update(limits={"requests_per_minute": 1_000_000}, budget={"usd_per_day": 1_000_000})
    config["redis"] = {"url": redis_url, "when_down": when_down}
    path.write_text(yaml.safe_dump(config))
    return path


def _client(url: str, n: int, stop: threading.Event, sent: list[tuple[float, int, float]]) -> None:
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {TENANT_KEY}"}, timeout=30) as http:
        for i in range(100_000):
            if stop.is_set():
                return
            body = {"model": "fake", "messages": [{"role": "user", "content": f"client {n} request {i}"}]}
            began = time.monotonic()
            try:
                status = http.post("/v1/chat/completions", json=body).status_code
            except httpx.HTTPError:
                status = 0
            sent.append((began, status, (time.monotonic() - began) * 1000))


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 1) if ordered else 0.0


def run(how: str, when_down: str, clients: int, phase: float) -> dict[str, dict[str, object]]:
    with tempfile.TemporaryDirectory() as folder, fake_upstream() as upstream:
        redis = RedisServer(free_port()).start()
        gateway = Gateway(_config(Path(folder), upstream, redis.url, when_down), free_port(),
                          Path(folder) / "gateway.log")
        sent: list[tuple[float, int, float]] = []
        stop = threading.Event()
        threads = [threading.Thread(target=_client, args=(gateway.url, n, stop, sent)) for n in range(clients)]
        try:
            gateway.start()
            for thread in threads:
                thread.start()
            time.sleep(phase)
            outage = time.monotonic()
            if how == "kill":
                redis.kill()
            else:
                redis.freeze()
            time.sleep(phase)
            back = time.monotonic()
            if how == "kill":
                redis.start()
            else:
                redis.freeze(False)
            time.sleep(phase)
        finally:
            stop.set()
            for thread in threads:
                if thread.is_alive():
                    thread.join(60)
            gateway.stop()
            redis.kill()  # SIGKILL ends a frozen one too
        said = [json.loads(line)["message"] for line in (Path(folder) / "gateway.log").read_text().splitlines()
                if '"gateway.outages"' in line]
    report: dict[str, dict[str, object]] = {}
    for name, (start, end) in zip(PHASES, ((0.0, outage), (outage, back), (back, float("inf")))):
        rows = [(status, ms) for began, status, ms in sent if start <= began < end]
        statuses: dict[str, int] = {}
        for status, _ in rows:
            statuses[str(status)] = statuses.get(str(status), 0) + 1
        latencies = [ms for _, ms in rows]
        report[name] = {"answers": statuses, "p50_ms": _percentile(latencies, 0.5),
                        "p99_ms": _percentile(latencies, 0.99), "max_ms": round(max(latencies, default=0.0), 1)}
    report["log"] = {"gateway.outages": said}
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--how", choices=("kill", "freeze"), default="kill")
    parser.add_argument("--when-down", choices=("local", "refuse"), default="local")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--phase-seconds", type=float, default=4.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = run(args.how, args.when_down, args.clients, args.phase_seconds)
    if args.json:
        print(json.dumps({"how": args.how, "when_down": args.when_down, "clients": args.clients, **report}))
    else:
        print(f"redis {args.how}, when_down {args.when_down}, {args.clients} clients, {args.phase_seconds:g} s a phase")
        for name in PHASES:
            row = report[name]
            print(f"  {name:>6}: answers {row['answers']}  p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms  "
                  f"max {row['max_ms']} ms")
        for line in report["log"]["gateway.outages"]:
            print(f"  logged: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
