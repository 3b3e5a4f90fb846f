"""The burst phase of bench/proxy_compare.py (bench/memory_burst.py), its parts that need no server under
test: the bodies are JSON chat requests of the asked size, each its own conversation; the RSS figures
read the samples as documented; a burst counts every answer but a 200 chat completion as an error and
never raises; the summary's ratios. A loopback server plays the target where one is needed; nothing is
timed."""
from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from bench.memory_burst import (MIB, ROUNDS, RssSampler, answer_error, burst, burst_bodies, burst_body,
                                rss_comparison)
from scripts.processes import free_port


@pytest.mark.parametrize("size", [256 * 1024, 2 * MIB])
def test_a_body_is_a_chat_request_of_tool_results_just_under_its_size(size: int) -> None:
    body = burst_body(3, size)
    assert size * 0.98 <= len(body) <= size
    request = json.loads(body)
    assert request["model"] == "fake"
    tool_results = [message["content"] for message in request["messages"] if message["role"] == "tool"]
    assert len(tool_results) == ROUNDS
    assert sum(len(json.dumps(result)) for result in tool_results) >= 0.95 * size  # the rest: the frame
    calls = [message["tool_calls"][0]["id"] for message in request["messages"] if message["role"] == "assistant"]
    assert calls == [message["tool_call_id"] for message in request["messages"] if message["role"] == "tool"]


def test_thirty_mib_stays_under_the_gateways_body_limit() -> None:
    assert 0.99 * 30 * MIB <= len(burst_body(0, 30 * MIB)) <= 30 * MIB < 32 * MIB


def test_each_client_sends_a_conversation_of_its_own() -> None:
    requests = [json.loads(body) for body in burst_bodies(3, 64 * 1024)]
    first_words = {request["messages"][1]["content"] for request in requests}
    outputs = {request["messages"][3]["content"] for request in requests}
    assert len(first_words) == len(outputs) == 3
    assert burst_bodies(2, 64 * 1024) == burst_bodies(2, 64 * 1024)  # the same bodies for every target


def test_a_size_too_small_for_the_rounds_is_refused() -> None:
    with pytest.raises(ValueError, match="tool rounds"):
        burst_body(0, 1000)


def test_the_peak_and_the_settled_figure_read_the_samples() -> None:
    sampler = RssSampler(lambda: 0.0)
    assert math.isnan(sampler.peak()) and math.isnan(sampler.lowest_in_last(5))
    sampler.samples = [(0.0, 100.0), (1.0, 300.0), (6.0, 120.0), (7.0, 200.0), (9.0, 150.0), (12.0, math.nan)]
    assert sampler.peak() == 300.0
    assert sampler.lowest_in_last(5) == 150.0  # from 7.0 on: the 120 is a second too early
    assert sampler.lowest_in_last(6) == 120.0
    sampler.samples = [(0.0, 100.0), (1.0, math.nan)]  # the process exited
    assert math.isnan(sampler.lowest_in_last(0)) and sampler.peak() == 100.0


def test_only_a_200_chat_completion_is_an_answer() -> None:
    assert answer_error(httpx.Response(200, json={"id": "x", "choices": []})) is None
    assert answer_error(httpx.Response(200, content=b'{"error": "?"}')) == 'HTTP 200: {"error": "?"}'
    assert answer_error(httpx.Response(413, text="too large")) == "HTTP 413: too large"


class Target(BaseHTTPRequestHandler):
    """A chat completion to conversation 0, 413 to any other."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        first = json.loads(body)["messages"][1]["content"]
        status, payload = (200, b'{"choices": []}') if first.startswith("conversation 0:") else (413, b"too large")
        self.send_response(status)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def target() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Target)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_burst_counts_each_refusal_and_reads_the_rss(target: str) -> None:
    figures = burst(target, {"authorization": "Bearer sk-x"}, lambda: 42.0, burst_bodies(3, 32 * 1024),
                    settle=0, timeout=30)
    assert (figures["burst_errors"], figures["burst_first_error"]) == (2, "HTTP 413: too large")
    assert figures["rss_burst_peak_mb"] == figures["rss_after_burst_mb"] == 42.0


def test_a_burst_at_a_closed_port_is_recorded_not_raised() -> None:
    figures = burst(f"http://127.0.0.1:{free_port()}/v1", {}, lambda: math.nan, burst_bodies(2, 32 * 1024),
                    settle=0, timeout=30)
    assert figures["burst_errors"] == 2
    assert figures["burst_first_error"].startswith("ConnectError")
    assert math.isnan(figures["rss_burst_peak_mb"]) and math.isnan(figures["rss_after_burst_mb"])


def test_the_rss_ratios_are_the_gateways_over_the_others() -> None:
    gateway = {"rss_mb": 300.0, "rss_burst_peak_mb": 900.0, "rss_after_burst_mb": 360.0}
    litellm = {"rss_mb": 600.0, "rss_burst_peak_mb": 1800.0, "rss_after_burst_mb": 300.0}
    found = rss_comparison(gateway, litellm, "litellm")
    assert found["rss_mb"] == {"gateway": 300.0, "litellm": 600.0}
    assert (found["rss_ratio"], found["rss_burst_peak_ratio"], found["rss_after_burst_ratio"]) == (0.5, 0.5, 1.2)
    without_burst = rss_comparison({"rss_mb": 300.0}, {"rss_mb": 0.0}, "floor")
    assert without_burst["rss_after_burst_mb"]["floor"] != without_burst["rss_after_burst_mb"]["floor"]  # NaN
    assert all(math.isnan(without_burst[name]) for name in ("rss_ratio", "rss_burst_peak_ratio",
                                                             "rss_after_burst_ratio"))
