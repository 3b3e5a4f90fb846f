"""What the gateway keeps alive as load goes on, outside its bounded caches.

    .venv/bin/python bench/memory_growth.py [--policy coding-agent] [--windows 5] [--seconds 10]
        [--clients 20] [--transcript synthetic-100] [--trace]

Starts the constant upstream and `gateway serve` (SQLite) as bench/proxy_compare.py does, with
bench/memory_hook on the gateway's PYTHONPATH. Before the load and after each window of
--clients concurrent requests (proxy_compare's load: the transcript and one new tool round each, so
its one conversation grows by a round a request), it waits 3 s, then signals the gateway, which clears
every registered cache, the message memo and the request path's bounded tables (bench/memory_hook),
collects, trims, and reports what is still alive. Prints per step: requests so far, RSS before and
after the clearing, pymalloc's allocated blocks, the objects the collector tracks (the start's frozen
ones included), the message memos found, what the node-id table, the messages seen, the body layouts
and the recent assemblies (gateway/pipeline/assembly_bases.py) held before the clearing, and the types
that grew most. Live memory that keeps growing with requests after
the clearing is held outside the caches. --trace runs the gateway under tracemalloc (8 frames; several
times slower) and prints the allocation sites that grew in the last window.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import proxy_compare as pc  # noqa: E402
from bench_transcripts import build_transcripts  # noqa: E402


def census(server: pc.Server, report: Path, timeout: float) -> dict:
    """Signal the gateway and wait for its report (newer than the last one)."""
    before = report.stat().st_mtime_ns if report.exists() else 0
    os.kill(server.process.pid, signal.SIGUSR1)  # type: ignore[union-attr]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if report.exists() and report.stat().st_mtime_ns > before:
            return json.loads(report.read_text())
        time.sleep(0.2)
    raise RuntimeError(f"the gateway wrote no memory report in {timeout:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="coding-agent")
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--transcript", default="synthetic-100")
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    [transcript] = build_transcripts(argparse.Namespace(seed=7, stream=False, quick=False,
                                                        transcripts=[args.transcript]))
    rounds = itertools.count(1)
    with tempfile.TemporaryDirectory(prefix="memory-growth-") as folder:
        root = Path(folder)
        (root / "upstream").mkdir()
        (root / "gateway").mkdir()
        report = root / "memory.json"
        upstream = pc.upstream_server(root / "upstream")
        upstream.start(30)
        try:
            with pc.gateway_server(args.policy, None, upstream, 1, root / "gateway") as gateway:
                gateway.env.update(PYTHONPATH=str(BENCH / "memory_hook"), GATEWAY_MEMORY_HOOK=str(report))
                if args.trace:
                    gateway.env["PYTHONTRACEMALLOC"] = "8"
                gateway.start(600 if args.trace else 60)
                print(f"policy {args.policy}, transcript {args.transcript}, {args.clients} clients, "
                      f"{args.seconds:g} s windows{', tracemalloc' if args.trace else ''}")
                print(f"{'requests':>9} {'RSS MB':>8} {'cleared':>8} {'pymalloc MB':>12} {'gc objects':>11} "
                      f"{'memos':>6} {'node ids':>9} {'seen':>7} {'layouts MB':>11} {'recent':>7}  grew most")
                requests, previous = 0, None
                try:
                    for window in range(args.windows + 1):
                        if window:
                            requests += len(pc.load_window(gateway, transcript, rounds, args.clients,
                                                           args.seconds, 0.2).latencies)
                        time.sleep(3)
                        found = census(gateway, report, 600 if args.trace else 60)
                        grew = "" if previous is None else ", ".join(
                            f"{name} +{count - previous['types'].get(name, 0)}"
                            for name, count in sorted(found["types"].items(),
                                                      key=lambda kv: previous["types"].get(kv[0], 0) - kv[1])[:4])
                        held = found["held"]
                        print(f"{requests:>9} {found['rss_mb_before']:>8.1f} {found['rss_mb']:>8.1f} "
                              f"{found['pymalloc_mb']:>12.1f} {found['gc_objects']:>11} {found['message_memos']:>6} "
                              f"{held['node_ids']:>9} {held['seen_messages']:>7} {held['body_layouts_mb']:>11.1f} "
                              f"{held['recent_assemblies']:>7}  "
                              f"{grew}", flush=True)
                        previous = found
                    for site in (previous or {}).get("growth", []):
                        print(f"\n+{site['mb']} MB in {site['blocks']} blocks, allocated at:")
                        print("\n".join(site["where"]))
                finally:
                    gateway.stop()
        finally:
            upstream.stop()


if __name__ == "__main__":
    main()
