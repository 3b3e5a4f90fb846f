"""bench/proxy_compare.py's CPU per request: a target's CPU time is its whole process tree's (a worker's
children included), read from /proc, and a load's figure is that time over the requests it answered.
The processes here are short Python children; every wait is bounded (a few seconds)."""
from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from proxy_compare import Server, Window, cpu_ms_per_request, load_summary  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")

# A parent that burns about 0.4 s of CPU, starts a child that burns as much, then both sleep.
BURN = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
TREE = (f"import subprocess, sys, time\n{BURN}"
        f"subprocess.Popen([sys.executable, '-c', {BURN + 'time.sleep(30)'!r}])\ntime.sleep(30)\n")


def test_a_load_is_its_cpu_time_over_the_requests_it_answered() -> None:
    windows = [Window([10.0] * 30, [], 1.0, cpu_seconds=0.3), Window([10.0] * 10, ["HTTP 500"], 1.0, cpu_seconds=0.1)]
    assert cpu_ms_per_request(windows) == pytest.approx(10.0)  # 0.4 s over 40 answered
    assert load_summary(20, windows)["cpu_ms_per_request"] == pytest.approx(10.0)
    assert math.isnan(cpu_ms_per_request([Window([1.0], [], 1.0)]))  # not measured: no figure, not 0
    assert math.isnan(cpu_ms_per_request([Window([], ["refused"], 1.0, cpu_seconds=0.2)]))


def test_a_targets_cpu_time_counts_its_children(tmp_path: Path) -> None:
    server = Server("tree", [sys.executable, "-c", TREE], 0, "", tmp_path / "tree.log")
    server.process = subprocess.Popen(server.command, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while server.cpu_seconds() < 0.7 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(server._tree()) == 2
        assert 0.7 <= server.cpu_seconds() < 3.0  # both halves counted, and the sleeping adds nothing
    finally:
        server.stop()
    assert math.isnan(server.cpu_seconds()) and math.isnan(server.rss_mb())


def _row(transcript: str, target: str, added: float, cpu: float) -> dict:
    return {"transcript": transcript, "target": target, "sequential": {"added_ms": {"median": added}},
            "load": {"20": {"cpu_ms_per_request": cpu}}}


def test_the_long_transcripts_figures_are_set_against_the_short_ones_per_target() -> None:
    from proxy_compare import scaling_comparisons
    rows = [_row("synthetic-100", "direct", 0.01, 0.4), _row("synthetic-1000", "direct", 0.1, 0.5),
            _row("synthetic-100", "floor", 0.8, 2.0), _row("synthetic-1000", "floor", 2.4, 3.0),
            _row("synthetic-100", "gateway-coding-agent-sqlite", 5.0, 8.0),
            _row("synthetic-1000", "gateway-coding-agent-sqlite", 20.0, 32.0),
            _row("trace-99", "litellm-proxy", 14.0, 20.0), _row("synthetic-100", "litellm-proxy", 14.0, 20.0),
            {"transcript": "synthetic-1000", "target": "litellm-proxy", "failed": "did not start"}]
    found = {c["target"]: c for c in scaling_comparisons(rows)}
    assert set(found) == {"floor", "gateway-coding-agent-sqlite"}  # direct is the reference; a failed row: none
    assert found["floor"]["added_median_ratio"] == pytest.approx(3.0)
    assert found["gateway-coding-agent-sqlite"]["added_median_ratio"] == pytest.approx(4.0)
    assert found["gateway-coding-agent-sqlite"]["cpu20_ratio"] == pytest.approx(4.0)
    no_load = [_row("synthetic-100", "floor", 0.8, 2.0), {**_row("synthetic-1000", "floor", 2.4, 3.0), "load": {}}]
    [only] = scaling_comparisons(no_load)
    assert only["added_median_ratio"] == pytest.approx(3.0) and math.isnan(only["cpu20_ratio"])


def test_the_load_generators_cpu_is_its_own_figure_and_bounds_what_more_workers_serve() -> None:
    """The load generator's CPU over the answered requests (this process's, beside the target's), and the
    most two workers of a target serve against one on CPUs shared with the generator and the upstream."""
    from proxy_compare import workers_bound
    windows = [Window([10.0] * 30, [], 1.0, cpu_seconds=0.3, client_cpu_seconds=0.06),
               Window([10.0] * 10, [], 1.0, cpu_seconds=0.1, client_cpu_seconds=0.02)]
    assert load_summary(20, windows)["client_cpu_ms_per_request"] == pytest.approx(2.0)  # 0.08 s over 40
    assert math.isnan(cpu_ms_per_request([Window([1.0], [], 1.0, cpu_seconds=0.1)], client=True))
    # 2 CPUs, a gateway at 4 ms a request, the generator at 3, the upstream at 1: 2 * 4 / 8 = 1x at most
    assert workers_bound(4.0, 3.0, 1.0, cpus=2) == pytest.approx(1.0)
    assert workers_bound(4.0, 0.0, 0.0, cpus=8) == 2.0  # CPUs to spare: the count of workers bounds it
    assert math.isnan(workers_bound(4.0, math.nan, 1.0, cpus=2))


def test_a_measured_window_times_the_load_generator_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_window` reads this process's CPU time around the measured load, as it reads the target's."""
    import asyncio
    from types import SimpleNamespace

    import proxy_compare

    async def drive(*_args: object) -> Window:
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass
        return Window([1.0], [], 0.05)

    target = SimpleNamespace(api_base="http://127.0.0.1:9/v1", headers={}, cpu_seconds=lambda: 1.0)
    monkeypatch.setattr(proxy_compare, "_drive", drive)
    window = asyncio.run(proxy_compare._window(target, None, iter(()), 1, 0.05, 0.0))  # type: ignore[arg-type]
    assert window.cpu_seconds == 0.0 and 0.04 <= window.client_cpu_seconds < 1.0
