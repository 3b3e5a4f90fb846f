"""The shared traces in every wire format (bench/format_replay.py).

The same savings through /v1/messages, /v1/responses and Gemini's generateContent as through the Chat path,
no invalid request, and the prompt cost of the gateway's Anthropic cache markers
against the client's own replay with Claude Code's markers (the figures the closing
notes quote; the bounds here guard against regressions).
"""
from __future__ import annotations

import statistics

from bench.format_replay import run, total_reduction


def test_every_format_saves_alike_and_markers_keep_the_cache() -> None:
    rows = run("coding-agent")
    assert len(rows) >= 10
    for row in rows:
        assert row["invalid_requests"] == 0, row
        assert abs(row["reduction_responses"] - row["reduction_chat"]) <= 0.02, row
        assert abs(row["reduction_gemini"] - row["reduction_chat"]) <= 0.02, row
        # Anthropic: the first compaction pays for the rehydration tool it adds (bench/format_replay.py),
        # so a trace may be compacted less there than on the Chat path, or more: that first move comes
        # later, when starting it at the first round pays, where the Chat path's earlier first move left
        # a small first round verbatim for good (sweagent_demo_ctf_web_i_got_id: 2.8 points more)
        assert abs(row["reduction_anthropic"] - row["reduction_chat"]) <= 0.03 or \
            row["reduction_anthropic"] < row["reduction_chat"], row
        assert row["cost_vs_client"] <= 1.0, row
    assert abs(total_reduction(rows, "anthropic") - total_reduction(rows, "chat")) <= 0.02
    assert abs(total_reduction(rows, "responses") - total_reduction(rows, "chat")) <= 0.02
    assert abs(total_reduction(rows, "gemini") - total_reduction(rows, "chat")) <= 0.02
    heavy = [row["cost_vs_client"] for row in rows if row["tool_calls"] >= 20]
    assert statistics.median(heavy) <= 0.83
    assert sum(row["reduction_anthropic"] > 0.3 for row in rows) >= 6
