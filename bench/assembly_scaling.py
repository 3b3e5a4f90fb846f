"""How projection time grows with the length of an agent run. Prints ms per request.

A synthetic coding-agent transcript of N tool rounds (60-line outputs, every seventh one
a failure), projected under the coding-agent preset: the path hashing, the records and
the assembly, as the gateway does them per request. "assemble ms" replays every round
(a conversation the process has not seen); "next request ms" is the assembly of the N-round
request right after the (N-1)-round one, as the gateway does it (token counts remembered per
node, the epoch replay resumed from the previous request's state); "next place ms" places that request's
messages in the tree as the gateway does (policies/canonical.py `NodeIds.path`, with the digests parsing
works out), right after the previous request's.

.venv/bin/python bench/assembly_scaling.py [--rounds 100 300 600] [--repeats 5] [--small]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.upstream.encodings import use_bundled_encodings  # noqa: E402
from policies.assembler import assemble  # noqa: E402
from policies.canonical import NodeIds, exact_digest  # noqa: E402
from policies.path_records import path_tokens, records_for_path  # noqa: E402
from policies.presets import preset  # noqa: E402
from policies.transcript import message_path  # noqa: E402

use_bundled_encodings()  # tiktoken's files from LiteLLM's folder, offline

OUTPUT = "\n".join(f"line {i}: build output with some words in it" for i in range(60))
SMALL = "ok: 3 files changed"  # under min_tokens: no round is ever worth compacting, the boundary stays


def transcript(rounds: int, small: bool = False) -> list[dict]:
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix the bug."}]
    for r in range(rounds):
        call = {"id": f"c{r}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": f"make step{r}"})}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        result = (f"Error: step {r} failed\n" if r % 7 == 0 else f"step {r} ok\n") + (SMALL if small else OUTPUT)
        messages.append({"role": "tool", "tool_call_id": f"c{r}", "content": result})
    return messages


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, nargs="+", default=[100, 300, 600])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="results too small to compact (the boundary never moves)")
    args = parser.parse_args()
    policy = preset("coding-agent")
    print(f"command: {' '.join(sys.argv)}")
    print(f"{'rounds':>7} {'messages':>9} {'total ms':>9} {'assemble ms':>12} {'next request ms':>16} "
          f"{'next place ms':>14} {'tokens sent':>12} {'forwarded':>10}")
    node_ids = NodeIds()
    for rounds in args.rounds:
        messages = transcript(rounds, args.small)
        totals, assembling, following, placing = [], [], [], []
        for repeat in range(args.repeats + 1):  # the first run fills the caches a live gateway has warm
            started = time.perf_counter()
            path = message_path("bench", messages)
            records = records_for_path(path, 0.0)
            assembling_from = time.perf_counter()
            projection = assemble(policy, messages, records, 0.0)
            done = time.perf_counter()
            totals.append((done - started) * 1000)
            assembling.append((done - assembling_from) * 1000)
            # the gateway's way: the previous request (one round less) first, then this one
            earlier = message_path(f"bench-{repeat}", messages[:-2])
            assemble(policy, messages[:-2], records_for_path(earlier, 0.0), 0.0, tokens=path_tokens(earlier),
                     node_ids=[n.id for n in earlier])
            path = message_path(f"bench-{repeat}", messages)
            records = records_for_path(path, 0.0)
            assembling_from = time.perf_counter()
            assemble(policy, messages, records, 0.0, tokens=path_tokens(path), node_ids=[n.id for n in path])
            following.append((time.perf_counter() - assembling_from) * 1000)
            node_ids.path(f"bench-{repeat}", messages[:-2], [exact_digest(m) for m in messages[:-2]])
            digests = [exact_digest(m) for m in messages]
            placing_from = time.perf_counter()
            node_ids.path(f"bench-{repeat}", messages, digests)
            placing.append((time.perf_counter() - placing_from) * 1000)
        print(f"{rounds:>7} {len(messages):>9} {statistics.median(totals[1:]):>9.1f} "
              f"{statistics.median(assembling[1:]):>12.1f} {statistics.median(following[1:]):>16.1f} "
              f"{statistics.median(placing[1:]):>14.2f} "
              f"{projection.tokens_original:>12} {projection.tokens_forwarded:>10}")


if __name__ == "__main__":
    main()
