"""bench/direct_prep.py still runs against the code it times: LiteLLM's preparation, whole and through
the memo, builds the same call for every body (its own assertion), and answers are read."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from direct_prep import time_answers, time_requests, turns  # noqa: E402

from gateway.upstream.litellm_client.chat_preparation import MessageMemo  # noqa: E402


def test_both_ways_of_preparing_build_the_same_call_for_every_body() -> None:
    bodies = turns(12, 3)
    assert len(bodies) == 6 and all('"model"' not in body[:20] for body in bodies)
    for stream in (False, True):
        spent = time_requests(bodies, stream=stream, memo=MessageMemo())
        assert {way: len(times) for way, times in spent.items()} == {"whole": 6, "memo": 6}
        assert all(seconds >= 0 for times in spent.values() for seconds in times)


def test_answers_are_read() -> None:
    assert len(time_answers(3)) == 3
