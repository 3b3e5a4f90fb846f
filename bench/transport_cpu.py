"""What posting one chat body to the deployment costs the gateway's process in CPU, by HTTP client.

    .venv/bin/python bench/transport_cpu.py [--messages 100] [--requests 2000] [--repeats 2]

The direct transport (gateway/upstream/direct_chat.py) posts over httpx on LiteLLM's aiohttp transport,
the pooled client LiteLLM's OpenAI handler makes. This posts the same body (a synthetic coding-agent
session of --messages messages, bench/bench_transcripts.py, as the direct transport would send it) to the
constant upstream (bench/constant_upstream.py, a process of its own) --requests times, one after the
other, reading and parsing each answer: through that client, and through a plain aiohttp session. It
prints the process CPU time per request of each, --repeats times alternated. Only the client's side is
in the figure: the upstream is another process.

Measured (2 CPUs, 100 messages, 2,000 requests, two rounds): 593 and 590 us through httpx on LiteLLM's
transport, 196 and 190 us through aiohttp alone.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from bench_transcripts import synthetic_session  # noqa: E402
from proxy_compare import upstream_server  # noqa: E402

HEADERS = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json", "Accept": "application/json"}
WARMUP = 50


def _completion(data: bytes) -> dict[str, Any]:
    answer = json.loads(data)
    if answer.get("object") != "chat.completion":
        raise SystemExit(f"the upstream answered no chat completion: {data[:200]!r}")
    return answer


async def through_litellm_client(url: str, body: bytes, requests: int) -> float:
    """CPU seconds per request through the client LiteLLM's OpenAI handler makes (httpx, aiohttp transport)."""
    from litellm.llms.openai.common_utils import BaseOpenAILLM
    client = BaseOpenAILLM._get_async_http_client()
    assert client is not None
    for number in range(WARMUP + requests):
        if number == WARMUP:
            started = time.process_time()
        response = await client.post(url, content=body, headers=HEADERS)
        _completion(response.content)
    return (time.process_time() - started) / requests


async def through_aiohttp(url: str, body: bytes, requests: int) -> float:
    """CPU seconds per request through one plain aiohttp session."""
    import aiohttp
    async with aiohttp.ClientSession() as session:
        for number in range(WARMUP + requests):
            if number == WARMUP:
                started = time.process_time()
            async with session.post(url, data=body, headers=HEADERS) as response:
                _completion(await response.read())
    return (time.process_time() - started) / requests


WAYS: dict[str, Callable[[str, bytes, int], Awaitable[float]]] = {
    "httpx on LiteLLM's aiohttp transport": through_litellm_client,
    "aiohttp alone": through_aiohttp,
}


def measure(messages: int, requests: int, repeats: int) -> dict[str, list[float]]:
    """Microseconds of CPU per request, by way, each way `repeats` times (alternated)."""
    with tempfile.TemporaryDirectory(prefix="transport-cpu-") as folder:
        upstream = upstream_server(Path(folder)).start(60)
        try:
            url = f"{upstream.api_base}/chat/completions"
            body = json.dumps({"model": "fake", "messages": synthetic_session(messages, 7)}).encode()
            out: dict[str, list[float]] = {way: [] for way in WAYS}
            for _ in range(repeats):
                for way, run in WAYS.items():
                    out[way].append(asyncio.run(run(url, body, requests)) * 1e6)
            return out
        finally:
            upstream.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if args.messages < 1 or args.requests < 1 or args.repeats < 1:
        raise SystemExit("--messages, --requests and --repeats are at least 1")
    for way, figures in measure(args.messages, args.requests, args.repeats).items():
        print(f"{way:40} {' / '.join(f'{us:.0f}' for us in figures)} us CPU per request")


if __name__ == "__main__":
    main()
