"""bench/profile_path.py: py-spy's collapsed stacks are shared out among the parts of a request by the
frames they pass through, and the transcripts are the ones the other benchmarks use."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import profile_path  # noqa: E402


def test_each_part_is_the_share_of_the_samples_passing_through_it(tmp_path: Path) -> None:
    raw = tmp_path / "stacks.txt"
    raw.write_text("\n".join([
        "run (uvicorn/main.py:1);handle (gateway/pipeline/request_path.py:396);ingest (storage/capture.py:98) 30",
        "run (uvicorn/main.py:1);project (gateway/pipeline/projection.py:54);count (policies/tokens.py:73) 20",
        "run (uvicorn/main.py:1);_chat (gateway/upstream/litellm_client/client.py:357) 10",
        "run (uvicorn/main.py:1);parse (gateway/wire/json_body.py:102) 15",
        "post (httpx/_client.py:1144);send (httpx/_client.py:914) 5",
        "run (uvicorn/main.py:1);app (starlette/routing.py:683) 20",
        "a line py-spy cut short: excerpt:]",
    ]))
    total, parts = profile_path.shares(raw)
    assert total == 100
    assert list(parts.values()) == [0.30, 0.10, 0.20, 0.15, 0.05]


def test_the_transcripts_are_named_as_elsewhere() -> None:
    assert profile_path.transcript_named("synthetic-40").name == "synthetic-40"
    assert len(profile_path.transcript_named("synthetic-40").messages) == 40
    assert profile_path.transcript_named("trace-99").name == "trace-99"
    with pytest.raises(SystemExit):
        profile_path.transcript_named("synthetic-many")
