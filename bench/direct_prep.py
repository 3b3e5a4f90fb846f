"""What the direct transport's preparation costs per request: `openai_request` (LiteLLM's message and
param preparation, gateway/upstream/litellm_client/direct.py) and `OpenAIDirectCodec.completion` (reading an answer).
Prints median microseconds per call; no server, no socket.

.venv/bin/python bench/direct_prep.py [--sizes 100 1000] [--rounds 40] [--repeats 5]

As agents send it: each turn resends the transcript as it is, then the transcript plus one tool round
never seen before (bench/bench_transcripts.py's synthetic coding-agent sessions, seed 7). Every request
gets fresh message objects (the body as the gateway parses it), made outside the timing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import httpx  # noqa: E402
from bench_transcripts import TOOLS, synthetic_session  # noqa: E402

from gateway.upstream.direct_chat import DirectCall  # noqa: E402
from gateway.upstream.litellm_client.chat_preparation import MessageMemo  # noqa: E402
from gateway.upstream.litellm_client.client import LiteLLMUpstream  # noqa: E402
from gateway.upstream.litellm_client.direct import OpenAIDirectCodec, direct_route, openai_request  # noqa: E402
from gateway.upstream.seam import UpstreamRequest  # noqa: E402

PARAMS = {"model": "openai/fake", "api_base": "http://upstream.test/v1", "api_key": "sk-upstream"}
ANSWER = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "fake",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Let me read the parser.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_file",
                                                              "arguments": '{"path": "src/parser.py"}'}}]}}],
    "usage": {"prompt_tokens": 12000, "completion_tokens": 30, "total_tokens": 12030}}).encode()


def turns(size: int, rounds: int) -> list[str]:
    """Request bodies as JSON: the transcript, then per turn the same again and the one with a new round."""
    session = synthetic_session(size + 2 * rounds, 7)
    bodies = []
    for turn in range(rounds):
        for grown in (0, 2):
            # as the gateway hands it on: the deployment names the model, never the client's body
            bodies.append(json.dumps({"tools": TOOLS, "messages": session[:size + 2 * turn + grown]}))
    return bodies


def time_requests(bodies: list[str], stream: bool, memo: MessageMemo) -> dict[str, list[float]]:
    """CPU seconds per `openai_request`: each body prepared by LiteLLM whole (`memo=None`, as before the
    memo) and through `memo`, interleaved (the order flipped every other body) so both see the same load."""
    upstream = LiteLLMUpstream(direct_transport=True)
    route = direct_route(PARAMS)
    assert route is not None
    spent: dict[str, list[float]] = {"whole": [], "memo": []}
    for n, text in enumerate(bodies):
        built = {}
        for way in (("whole", "memo") if n % 2 else ("memo", "whole")):
            request = UpstreamRequest(alias="fake", litellm_params=PARAMS, body=json.loads(text), timeout_seconds=30,
                                      request_id="req-1", extra_headers={})
            kwargs = upstream._kwargs(request, stream)
            started = time.thread_time()
            built[way] = openai_request(route, kwargs, stream, memo=memo if way == "memo" else None)
            spent[way].append(time.thread_time() - started)
        assert built["whole"] is not None and built["whole"] == built["memo"]
    return spent


def time_answers(count: int) -> list[float]:
    codec = OpenAIDirectCodec()
    request = UpstreamRequest(alias="fake", litellm_params=PARAMS, body={}, timeout_seconds=30, request_id="r",
                              extra_headers={})
    call = DirectCall(url="http://upstream.test/v1/chat/completions", headers={}, body=b"", timeout=30,
                      model="fake", request=request)
    spent = []
    for _ in range(count):
        response = httpx.Response(200, content=ANSWER, headers={"content-type": "application/json"})
        started = time.thread_time()
        codec.completion(response, call)
        spent.append(time.thread_time() - started)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--rounds", type=int, default=40, help="turns per pass (two requests each)")
    parser.add_argument("--repeats", type=int, default=5, help="passes, each with an empty memo")
    args = parser.parse_args()
    time_requests(turns(10, 3), stream=False, memo=MessageMemo())  # LiteLLM's first-call imports
    for size in args.sizes:
        bodies = turns(size, args.rounds)
        spent: dict[str, dict[str, list[float]]] = {way: {"resent": [], "grown": [], "first": []}
                                                     for way in ("whole", "memo")}
        for _ in range(args.repeats):
            for way, times in time_requests(bodies, stream=True, memo=MessageMemo()).items():
                spent[way]["first"].append(times[0])  # a transcript never seen
                spent[way]["resent"] += times[2::2]
                spent[way]["grown"] += times[1::2]
        for way, kinds in spent.items():
            print(f"{size:>5} messages, {way:>5}: openai_request median us (CPU): "
                  + "   ".join(f"{kind} {statistics.median(times) * 1e6:7.0f}" for kind, times in kinds.items())
                  + f"   ({sum(map(len, kinds.values()))} requests)")
    answers = time_answers(2000)
    print(f"completion reading median us (CPU): {statistics.median(answers) * 1e6:.0f} (2000 answers)")


if __name__ == "__main__":
    main()
