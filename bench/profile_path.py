"""Where a request's CPU goes: py-spy samples of the gateway serving one transcript, by part.

Runs the app in this process (bench/conversation_memory.py's `Gateway`, the constant upstream in a
process of its own), posts `--requests` requests one after another (the transcript alone, then with a
new tool round, alternately, as bench/proxy_compare.py does) while py-spy samples this process (`--gil`:
only the thread that holds the GIL, so waits do not count), and prints the share of the samples whose
stack passes through each part. py-spy is not a dependency of the gateway: install it where you like
(`pip install py-spy`) and name it with `--py-spy` if it is not on PATH; it needs leave to read this
process's memory (ptrace: root, or `kernel.yama.ptrace_scope` 0).

    .venv/bin/python bench/profile_path.py --transcript synthetic-100 --requests 600 [--postgres URL]

`--burst-mb N` profiles large bodies instead: each request a conversation of its own of at most N MiB
(bench/memory_burst.py's burst bodies: 40 tool rounds), sent one after another, sampled on every thread
that runs (not only the GIL's holder: tiktoken and zlib let it go while they work).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_transcripts import TOOLS, Transcript, alternating_sender, synthetic_session, trace_session  # noqa: E402
from memory_burst import MIB, burst_bodies  # noqa: E402
from scripts.processes import postgres_schema  # noqa: E402

# A part is named by a frame any of its samples' stacks passes through.
PARTS = {
    "the store (capture, the reads after it, the outcome)": ("storage/",),
    "the upstream call (preparation, the call, reading the answer)": ("gateway/upstream/",),
    "the projection": ("gateway/pipeline/projection.py",),
    "parsing the body": ("gateway/wire/json_body.py",),
    "this benchmark's own client": ("httpx/_client.py:1144",),
}


def transcript_named(name: str) -> Transcript:
    if name == "trace-99":
        messages, tools = trace_session(99)
        return Transcript(name, messages, tools, False)
    if not name.startswith("synthetic-") or not name.split("-", 1)[1].isdigit():
        raise SystemExit("--transcript: trace-99 or synthetic-N")
    return Transcript(name, synthetic_session(int(name.split("-", 1)[1]), 7), TOOLS, False)


def shares(raw: Path) -> tuple[int, dict[str, float]]:
    """py-spy's raw (collapsed) output: the samples, and the share of them each part is in."""
    total, found = 0, Counter[str]()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        for part, frames in PARTS.items():
            if any(frame in stack for frame in frames):
                found[part] += int(count)
    return total, {part: found[part] / total if total else 0.0 for part in PARTS}


def body_sender(client: Any, bodies: list[bytes]) -> Callable[[int], None]:
    """`send(number)`: posts `bodies[number]`; anything but a 200 ends the run with the gateway's words."""

    def send(number: int) -> None:
        response = client.post("/chat/completions", content=bodies[number])
        if response.status_code != 200:
            raise SystemExit(f"HTTP {response.status_code}: {response.text[:300]}")

    return send


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcript", default="synthetic-100", help="trace-99 or synthetic-N (default synthetic-100)")
    parser.add_argument("--requests", type=int, default=600, help="sampled requests (default 600)")
    parser.add_argument("--warmup", type=int, default=40, help="requests first, not sampled (default 40)")
    parser.add_argument("--policy", default="coding-agent")
    parser.add_argument("--rate", type=int, default=500, help="py-spy samples a second (default 500)")
    parser.add_argument("--py-spy", dest="py_spy", default=shutil.which("py-spy"), help="the py-spy binary")
    parser.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here")
    parser.add_argument("--postgres", metavar="URL", help="a fresh schema of this PostgreSQL server, not SQLite")
    parser.add_argument("--burst-mb", dest="burst_mb", type=float, default=0,
                        help="profile bodies of this many MiB, one conversation each, instead of --transcript")
    args = parser.parse_args()
    if not args.py_spy:
        raise SystemExit("py-spy not found: `pip install py-spy` (anywhere) and pass --py-spy PATH")
    if args.requests < 1 or args.warmup < 0:
        raise SystemExit("--requests >= 1, --warmup >= 0")
    import httpx
    from conversation_memory import Gateway

    transcript = transcript_named(args.transcript)
    bodies = burst_bodies(args.warmup + args.requests, int(args.burst_mb * MIB)) if args.burst_mb > 0 else []
    name = f"bodies of {args.burst_mb:g} MiB" if bodies else transcript.name
    with tempfile.TemporaryDirectory(prefix="profile-path-") as folder, \
            (postgres_schema(args.postgres) if args.postgres else contextlib.nullcontext(None)) as storage_url:
        raw = args.raw or Path(folder) / "stacks.txt"
        with Gateway(Path(folder), storage_url=storage_url, policy=args.policy) as gateway, \
                httpx.Client(base_url=gateway.api_base, headers=gateway.headers, timeout=120, trust_env=False) as client:
            send = body_sender(client, bodies) if bodies else alternating_sender(client, transcript)
            for number in range(args.warmup):
                send(number)
            threads = [] if bodies else ["--gil"]
            spy = subprocess.Popen([args.py_spy, "record", "--pid", str(os.getpid()), "--rate", str(args.rate),
                                    *threads, "--nonblocking", "--format", "raw", "--output", str(raw)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(1.5)  # py-spy attaches
            if spy.poll() is not None:
                raise SystemExit(f"py-spy could not sample: {spy.stderr.read().decode(errors='replace')[:500]}")
            started, cpu = time.perf_counter(), time.process_time()
            for number in range(args.warmup, args.warmup + args.requests):
                send(number)
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
            spy.send_signal(2)  # py-spy writes what it has on SIGINT
            spy.wait(60)
        total, parts = shares(raw)
    print(f"{name}, {args.policy}: {wall / args.requests * 1000:.2f} ms wall and "
          f"{cpu / args.requests * 1000:.2f} ms CPU a request (this process: the gateway and its client), "
          f"{total} samples {'of running threads' if bodies else 'holding the GIL'}")
    for part, share in parts.items():
        print(f"  {share * 100:5.1f}%  {part}")
    print(f"  {max(0.0, 1 - sum(parts.values())) * 100:5.1f}%  at least, the rest (the ASGI stack, uvicorn, the event "
          f"loop, thread handoffs): the parts may overlap")


if __name__ == "__main__":
    main()
