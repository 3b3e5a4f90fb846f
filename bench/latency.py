"""The gateway's ADDED latency over calling the upstream directly (median and p99).

    .venv/bin/python bench/latency.py [--requests N] [--warmup W] [--stream]

Starts the scripted fake upstream (testkit/fake_upstream.py) and the gateway on
real sockets on 127.0.0.1, the gateway over a fresh SQLite database and blob
dir in a temporary folder. Then sends the same request bodies, as an agent
would, once straight to the upstream and once through the gateway, pair by
pair (the order flips every other pair, so machine noise hits both alike),
and reports per-pair `gateway - direct`.

The transcript is ~100 messages of a real tool-using agent trace (the first
one in tests/data/traces with >= 100 messages, cut back so it ends on an
answered tool round), or a synthetic one if no trace is there. Requests
alternate between two agent turn shapes, reported separately and together:
  (a) resend: the same transcript again (steady state: every node is known);
  (b) +round: the transcript plus one NEW tool round (real capture work:
      new nodes, a tool call and an artifact are written before forwarding).
Both non-streaming (to the full response) and streaming (to the last byte)
are always timed: together ~15 s with the defaults. `--stream` is accepted
for the documented command line and changes nothing. Everything is bounded by
count and cleaned up.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# As tests/conftest.py: offline LiteLLM price map and bundled tiktoken files,
# set before any gateway module (and LiteLLM) is imported.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
from gateway.upstream.encodings import use_bundled_encodings  # noqa: E402

use_bundled_encodings()

import httpx  # noqa: E402

from gateway.app import create_app  # noqa: E402
from gateway.config import parse_settings  # noqa: E402
from policies.protocol import ends_on_answered_round  # noqa: E402
from testkit.fake_upstream import FakeUpstream, ServerThread  # noqa: E402

TRACES_DIR = Path(os.environ.get("GATEWAY_TRACES_DIR", REPO / "tests" / "data" / "traces"))
TARGET_MESSAGES = 100
TENANT_KEY = "sk-acme-1"
BASH_TOOL = {"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
             "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


# --- the transcript -------------------------------------------------------

def synthetic_transcript() -> list[dict[str, Any]]:
    """system + user + 49 rounds of (assistant tool call, tool result of 300-3000 chars)."""
    rng = random.Random(7)
    words = "error build test file line value config module import return status ok".split()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the bash tool. " * 40},
        {"role": "user", "content": "Fix the failing test in the parser module and explain the cause."},
    ]
    for n in range(1, (TARGET_MESSAGES - 2) // 2 + 1):
        call_id = f"call_{n:03d}"
        messages.append({"role": "assistant", "content": f"Step {n}: let me look.", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"command": f"grep -rn step{n} src/"})}}]})
        text = " ".join(rng.choice(words) for _ in range(rng.randint(50, 500)))
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
    return messages


def load_transcript() -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """(source name, messages, tools): the first trace with >= 100 messages, else synthetic."""
    for path in sorted(TRACES_DIR.glob("*.jsonl")):
        text = path.read_text(encoding="utf-8").strip()
        try:
            trace = json.loads(text)
        except json.JSONDecodeError:
            trace = json.loads(text.splitlines()[0])
        messages = trace.get("messages") or []
        if len(messages) < TARGET_MESSAGES:
            continue
        cut = list(messages[:TARGET_MESSAGES])
        while cut and not ends_on_answered_round(cut):  # never leave a call unanswered
            cut.pop()
        if cut:
            return path.name, cut, trace.get("tools") or [BASH_TOOL]
    return "synthetic", synthetic_transcript(), [BASH_TOOL]


def round_templates(messages: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Real (assistant with one call, its tool result) pairs whose result is 300-3000 chars."""
    pairs = []
    for call, result in zip(messages, messages[1:]):
        if (call.get("role") == "assistant" and len(call.get("tool_calls") or []) == 1
                and result.get("role") == "tool" and 300 <= len(result.get("content") or "") <= 3000):
            pairs.append((call, result))
    return pairs


def new_round(n: int, templates: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[dict[str, Any]]:
    """Tool round number `n`, unique (new call id, marked content) so the gateway must capture it."""
    call, result = templates[n % len(templates)]
    call_id = f"call_bench_{n:05d}"
    tool_call = {**call["tool_calls"][0], "id": call_id}
    return [{**call, "tool_calls": [tool_call]},
            {**result, "tool_call_id": call_id, "content": f"{result['content']}\n[bench round {n}]"}]


# --- timing ---------------------------------------------------------------

def timed_ms(client: httpx.Client, body: bytes, stream: bool) -> float:
    """One POST /chat/completions, timed until the last byte of the response is read."""
    start = time.perf_counter()
    if stream:
        with client.stream("POST", "/chat/completions", content=body) as response:
            tail = b""
            for chunk in response.iter_raw():
                tail = (tail + chunk)[-64:]
        elapsed = time.perf_counter() - start
        ok = response.status_code == 200 and b"[DONE]" in tail
        detail = tail
    else:
        response = client.post("/chat/completions", content=body)
        elapsed = time.perf_counter() - start
        ok = response.status_code == 200 and bool(response.json().get("choices"))
        detail = response.content[:300]
    if not ok:
        raise SystemExit(f"{client.base_url}: HTTP {response.status_code}: {detail!r}")
    return elapsed * 1000


def run_mode(direct: httpx.Client, gateway: httpx.Client, fake: FakeUpstream, base: list[dict[str, Any]],
             tools: list[dict[str, Any]], templates: list, rounds: Iterator[int], requests: int,
             warmup: int, stream: bool) -> dict[str, list[tuple[float, float]]]:
    """(direct ms, gateway ms) pairs per variant; warmup pairs are sent but not kept."""
    samples: dict[str, list[tuple[float, float]]] = {"a": [], "b": []}
    for i in range(warmup + requests):
        variant = "ab"[i % 2]
        messages = base if variant == "a" else base + new_round(next(rounds), templates)
        body = {"model": "fake", "messages": messages, "tools": tools}
        if stream:
            body["stream"] = True
        raw = json.dumps(body).encode()  # serialised once: both sides get the same bytes
        if (i // 2) % 2:  # flip the order every other pair, so each variant sees both orders
            gateway_ms = timed_ms(gateway, raw, stream)
            direct_ms = timed_ms(direct, raw, stream)
        else:
            direct_ms = timed_ms(direct, raw, stream)
            gateway_ms = timed_ms(gateway, raw, stream)
        fake.reset()  # the fake keeps every body it saw; keep memory flat (outside the timing)
        if i >= warmup:
            samples[variant].append((direct_ms, gateway_ms))
    return samples


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (as numpy's default)."""
    ordered, k = sorted(values), (len(values) - 1) * q / 100
    lo, hi = math.floor(k), min(math.floor(k) + 1, len(values) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def print_table(title: str, samples: dict[str, list[tuple[float, float]]], labels: dict[str, str]) -> None:
    header = (f"{'':<24}{'n':>5}  {'direct med':>10} {'p99':>7}  {'gateway med':>11} {'p99':>7}"
              f"  {'ADDED med':>9} {'p99':>7}")
    print(f"\n{title} (ms)\n{header}\n{'-' * len(header)}")
    rows = [(labels["a"], samples["a"]), (labels["b"], samples["b"]), ("all", samples["a"] + samples["b"])]
    for label, pairs in rows:
        if not pairs:
            continue
        direct, gateway = [d for d, _ in pairs], [g for _, g in pairs]
        added = [g - d for d, g in pairs]  # per pair, so shared noise cancels
        cells = [percentile(v, q) for v in (direct, gateway, added) for q in (50, 99)]
        print(f"{label:<24}{len(pairs):>5}  {cells[0]:>10.2f} {cells[1]:>7.2f}  {cells[2]:>11.2f} "
              f"{cells[3]:>7.2f}  {cells[4]:>9.2f} {cells[5]:>7.2f}")


# --- main -----------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="measured pairs per mode (default 200)")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured pairs first (default 20)")
    parser.add_argument("--stream", action="store_true",
                        help="no-op: streaming (to the last byte) is always timed, it is cheap")
    args = parser.parse_args()
    if args.requests < 1 or args.warmup < 0:
        parser.error("--requests must be >= 1 and --warmup >= 0")

    source, base, tools = load_transcript()
    templates = round_templates(base) or round_templates(synthetic_transcript())
    results = sum(1 for m in base if m.get("role") == "tool")
    print(f"command: {shlex.join(getattr(sys, 'orig_argv', [sys.executable, *sys.argv]))}")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"nproc: {cpus}  (os.cpu_count {os.cpu_count()}); "
          f"python {platform.python_version()} on {platform.platform()}")
    size_kib = len(json.dumps({"messages": base, "tools": tools})) / 1024
    print(f"transcript: {source}: {len(base)} messages ({results} tool results), "
          f"{size_kib:.0f} KiB body with {len(tools)} tool schemas")
    print(f"variants: (a) resend {len(base)} msgs | (b) {len(base) + 2} msgs = one new tool round appended; "
          f"{args.requests} measured pairs per mode after {args.warmup} warmup, alternating a/b")

    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp, FakeUpstream() as fake:
        settings = parse_settings({
            "models": [{"name": "fake", "litellm_params": {
                "model": "openai/fake", "api_base": fake.api_base, "api_key": "sk-upstream"}}],
            "tenants": [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "default"}],
            "storage": {"url": f"sqlite:///{Path(tmp) / 'gateway.db'}", "blob_dir": str(Path(tmp) / "blobs")},
        }, "<bench>", tmp)
        server = ServerThread(create_app(settings)).start()
        json_headers = {"content-type": "application/json"}
        # trust_env=False: never route 127.0.0.1 traffic through a proxy from the environment.
        direct = httpx.Client(base_url=fake.api_base, timeout=60, trust_env=False,
                              headers={**json_headers, "authorization": "Bearer sk-upstream"})
        gateway = httpx.Client(base_url=f"{server.url}/v1", timeout=60, trust_env=False,
                               headers={**json_headers, "authorization": f"Bearer {TENANT_KEY}"})
        try:
            rounds = itertools.count(1)  # every (b) request, in any mode, gets a never-seen round
            labels = {"a": f"(a) resend {len(base)} msgs", "b": f"(b) +1 round {len(base) + 2} msgs"}
            for title, stream in (("non-streaming", False), ("streaming, to last byte", True)):
                started = time.monotonic()
                samples = run_mode(direct, gateway, fake, base, tools, templates, rounds,
                                   args.requests, args.warmup, stream)
                print_table(f"{title}, {time.monotonic() - started:.1f} s", samples, labels)
        finally:
            direct.close()
            gateway.close()
            server.stop()


if __name__ == "__main__":
    main()
