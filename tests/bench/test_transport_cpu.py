"""bench/transport_cpu.py still runs: both clients post the body to the constant upstream and read a chat
completion back (the bench refuses any other answer), and each gives a CPU figure per request."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from transport_cpu import WAYS, measure  # noqa: E402


def test_both_clients_post_and_read_answers() -> None:
    figures = measure(messages=4, requests=3, repeats=1)
    assert set(figures) == set(WAYS)
    assert all(len(values) == 1 and values[0] >= 0 for values in figures.values())
