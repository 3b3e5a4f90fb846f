"""Does ingest stay flat as a tenant's history grows? Prints median ingest time per request.

For each history size N, the tenant first gets N other sessions (a real trace with its first
user message varied), then the same 99-message transcript is ingested again and again (a resend,
what agents do every turn). SQLite in a temporary folder, or --url for PostgreSQL (give it an
empty schema: `?options=-csearch_path%3DNAME`; the tables are analysed after each load).

.venv/bin/python bench/ingest_scaling.py [--sizes 0 100 300] [--repeats 30] [--url postgresql+psycopg://...]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from gateway.commands.replay import load_trace, trace_turns  # noqa: E402
from gateway.upstream.encodings import use_bundled_encodings  # noqa: E402
from policies.transcript import message_path  # noqa: E402
from storage.blobs import DirectoryBlobStore  # noqa: E402
from storage.database import make_engine  # noqa: E402
from storage.record_types import RunStart  # noqa: E402
from storage.records import RecordStore  # noqa: E402

use_bundled_encodings()  # tiktoken's files from LiteLLM's folder, offline

TRACE = REPO / "tests" / "data" / "traces" / "openhands_codeact_llama4-maverick_ponyc-4588.jsonl"


def run(store: RecordStore, messages: list[dict]) -> float:
    started = time.perf_counter()
    store.ingest(message_path("acme", messages), RunStart(request_id=f"req_{uuid.uuid4().hex}", tenant="acme",
                 participant="p", model="fake", upstream_model="openai/fake", stream=False))
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 100, 300])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--url")
    args = parser.parse_args()
    messages, turns = trace_turns(load_trace(TRACE))
    transcript = messages[: turns[-1]]
    print(f"command: {' '.join(sys.argv)}")
    print(f"transcript: {TRACE.name}, {len(transcript)} messages; backend: {args.url or 'sqlite'}")
    print(f"{'other sessions':>15} {'artifacts':>10} {'ingest median ms':>17} {'p90 ms':>8}")
    with tempfile.TemporaryDirectory() as folder:
        url = args.url or f"sqlite:///{folder}/bench.db"
        store = RecordStore(make_engine(url), DirectoryBlobStore(Path(folder) / "blobs"))
        store.create_schema()
        made = 0
        for size in args.sizes:
            while made < size:
                variant = [dict(m) for m in transcript]
                variant[1] = {**variant[1], "content": f"{variant[1]['content']}\n(session {made})"}
                run(store, variant)
                made += 1
            if store.engine.dialect.name == "postgresql":
                # Planner statistics as autovacuum keeps them in steady state; right after a bulk
                # load PostgreSQL still plans for an empty table (sequential scans).
                with store.engine.begin() as connection:
                    connection.exec_driver_sql("ANALYZE")
            times = sorted(run(store, transcript) for _ in range(args.repeats))
            print(f"{size:>15} {store.count_artifacts('acme'):>10} {statistics.median(times):>17.2f} "
                  f"{times[int(len(times) * 0.9)]:>8.2f}")
        store.engine.dispose()


if __name__ == "__main__":
    main()
