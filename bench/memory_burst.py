"""The burst phase of bench/proxy_compare.py: a target's memory while it takes a few very large
requests at once, and how much of it the target gives back afterwards.

A burst is `clients` concurrent chat completions (`model: fake`), each a conversation of its own (its
own first user message, tool-call ids and outputs) whose body is `size` bytes at most and within a
few KB of it, nearly all of it tool results: 40 rounds of a `run` call and its output, lines of words
as a build log has (bench/large_bodies.py sends the same shape to one gateway). Distinct outputs per
conversation, so a store that keeps content by digest cannot keep one copy of them all. While the
burst runs and for `settle` seconds after its last answer, the target's RSS is sampled every 100 ms:
the peak is the highest sample (the settle included: work left after the answers counts), the
settled figure the lowest of the settle's last seconds (a trim a second after the answers, a
collection, a worker's recycling all count; one sample would catch the process mid-allocation).
Every request is bounded in time; an answer other than a 200 chat completion is an error.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import threading
import time
from typing import Any, Callable

import httpx

MIB = 1024 * 1024
ROUNDS = 40
WORDS_PER_LINE = 12
SAMPLE_SECONDS = 0.1
SETTLED_TAIL_SECONDS = 5.0
WORDS = ("error", "build", "src/main.rs", "warning", "line", "function", "return", "value", "test", "passed",
         "failed", "cargo", "module", "struct", "impl", "let", "match", "Some", "None", "Ok", "Err", "0x1f",
         "42", "unused", "variable", "compiling", "finished", "target", "debug", "release")


# --- bodies -----------------------------------------------------------------

def tool_output(rng: random.Random, size: int) -> str:
    """Lines of words whose JSON string form takes at most `size` bytes and within a line of it (the
    words are plain ASCII; a line break is two bytes, `\\n`, in JSON)."""
    lines: list[str] = []
    used = -2  # n lines, n - 1 breaks
    while True:
        line = " ".join(rng.choices(WORDS, k=WORDS_PER_LINE))
        if used + 2 + len(line) > size:
            return "\n".join(lines)
        lines.append(line)
        used += 2 + len(line)


def conversation(number: int, outputs: list[str]) -> dict[str, Any]:
    """A chat request: a coding agent's conversation `number`, one `run` round per output."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"conversation {number}: the build fails since the last merge; find out why "
                                    f"and fix it"}]
    for round_, output in enumerate(outputs):
        call = f"call_{number}_{round_}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function", "function": {"name": "run", "arguments": json.dumps({"n": round_})}}]})
        messages.append({"role": "tool", "tool_call_id": call, "content": output})
    return {"model": "fake", "messages": messages}


def burst_body(number: int, size: int) -> bytes:
    """Conversation `number` as a body of at most `size` bytes, all but its frame tool outputs."""
    frame = len(json.dumps(conversation(number, [""] * ROUNDS)))
    per_output = (size - frame) // ROUNDS
    if per_output < 1:
        raise ValueError(f"{size} bytes do not hold {ROUNDS} tool rounds (their frame alone is {frame})")
    rng = random.Random(number)
    body = json.dumps(conversation(number, [tool_output(rng, per_output) for _ in range(ROUNDS)])).encode()
    assert len(body) <= size, (len(body), size)
    return body


def burst_bodies(clients: int, size: int) -> list[bytes]:
    """One body per client, each its own conversation."""
    return [burst_body(number, size) for number in range(clients)]


# --- sampling ---------------------------------------------------------------

class RssSampler:
    """`rss()` every SAMPLE_SECONDS in a thread, with when it was read; NaN readings (the process has
    exited) are kept out of the figures."""

    def __init__(self, rss: Callable[[], float], every: float = SAMPLE_SECONDS) -> None:
        self.rss = rss
        self.every = every
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), self.rss()))
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self) -> float:
        return max((mb for _, mb in self.samples if not math.isnan(mb)), default=math.nan)

    def lowest_in_last(self, seconds: float) -> float:
        """The lowest sample of the last `seconds` before the last sample (the last one at least)."""
        if not self.samples:
            return math.nan
        since = self.samples[-1][0] - seconds
        return min((mb for at, mb in self.samples if at >= since and not math.isnan(mb)), default=math.nan)


# --- the burst --------------------------------------------------------------

def answer_error(response: httpx.Response) -> str | None:
    """None for a 200 chat completion; else what came back."""
    if response.status_code == 200 and b'"choices"' in response.content:
        return None
    return f"HTTP {response.status_code}: {response.text[:300]}"


async def _post(api_base: str, headers: dict[str, str], body: bytes, timeout: float) -> str | None:
    """One request on a connection of its own, `timeout` seconds at most in all; None or what went wrong."""
    async with httpx.AsyncClient(base_url=api_base, headers=headers, timeout=timeout, trust_env=False) as client:
        try:
            response = await asyncio.wait_for(client.post("/chat/completions", content=body), timeout)
        except asyncio.TimeoutError:
            return f"no answer within {timeout:.0f} s"
        except httpx.HTTPError as error:
            return f"{type(error).__name__}: {error}"
    return answer_error(response)


async def _post_all(api_base: str, headers: dict[str, str], bodies: list[bytes], timeout: float) -> list[str | None]:
    return list(await asyncio.gather(*(_post(api_base, headers, body, timeout) for body in bodies)))


def post_concurrently(api_base: str, headers: dict[str, str], bodies: list[bytes],
                      timeout: float) -> list[str | None]:
    """Every body at once, each on its own connection; per body None or its error."""
    return asyncio.run(_post_all(api_base, headers, bodies, timeout))


def burst(api_base: str, headers: dict[str, str], rss: Callable[[], float], bodies: list[bytes],
          settle: float, timeout: float) -> dict[str, Any]:
    """The bodies at once, then `settle` seconds of quiet, RSS sampled throughout: the row's burst figures."""
    with RssSampler(rss) as sampler:
        began = time.monotonic()
        try:
            errors = post_concurrently(api_base, headers, bodies, timeout)
        except Exception as error:  # the client side itself broke: every request counts as failed
            errors = [f"{type(error).__name__}: {error}"] * len(bodies)
        seconds = time.monotonic() - began
        time.sleep(settle)
    failures = [error for error in errors if error]
    return {"burst_seconds": seconds, "burst_errors": len(failures),
            "burst_first_error": failures[0] if failures else None,
            "rss_burst_peak_mb": sampler.peak(),
            "rss_after_burst_mb": sampler.lowest_in_last(min(SETTLED_TAIL_SECONDS, settle / 2))}


# --- summary ----------------------------------------------------------------

RSS_FIGURES = (("rss_mb", "rss_ratio"), ("rss_burst_peak_mb", "rss_burst_peak_ratio"),
               ("rss_after_burst_mb", "rss_after_burst_ratio"))


def rss_comparison(gateway: dict[str, Any], other: dict[str, Any], other_name: str) -> dict[str, Any]:
    """The gateway row's RSS after the load, at the burst's peak and settled after it, beside another
    row's, and gateway / other for each (NaN where either is missing or the other is not above 0)."""
    out: dict[str, Any] = {}
    for figure, ratio_name in RSS_FIGURES:
        mine, theirs = gateway.get(figure, math.nan), other.get(figure, math.nan)
        out[figure] = {"gateway": mine, other_name: theirs}
        out[ratio_name] = mine / theirs if theirs > 0 else math.nan
    return out
