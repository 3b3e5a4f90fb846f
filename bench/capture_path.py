"""The store's share of a model request, in process: capture, read-after-capture and finish_run.

Replays a synthetic coding-agent transcript (bench/bench_transcripts.py's `synthetic_session`) as
bench/proxy_compare.py sends it: requests alternate between the transcript as it is and the
transcript plus one tool round never seen before. Each request goes through the gateway's own code,
on one thread: the wire format's parse, `gateway.pipeline.request_path._capture_and_project` (path, capture,
projection, assembly record), the base of the assembly record (`RecentAssemblies.based`),
`finish_run` and `RecentAssemblies.remember`, as the run recorder does after the answer. Prints the
median milliseconds per request of the capture's write (`_write_capture`), its read
(`_read_after_capture`; on PostgreSQL it runs inside the write's transaction, so the write's figure
holds it too and the sum counts it twice) and `finish_run`, per transcript; on SQLite also how long each
of the two transactions held the write lock (storage/group_commit.py: one writer, so what is done under
it bounds throughput); with --encrypt also how many values a
request sealed and the CPU those seals took (inside the figures above), which the machine's noise
between two runs hides. A fresh SQLite file in a temporary folder,
or --url for PostgreSQL (give it an empty schema: `?options=-csearch_path%3DNAME`). --encrypt sets a random
`storage.encryption_key`, so every conversation column a request writes is sealed (storage/encryption.py).

.venv/bin/python bench/capture_path.py [--messages 100 1000] [--requests 200] [--policy coding-agent] [--encrypt]
    [--url URL [--link-delay-ms MS]]
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from gateway.upstream.encodings import use_bundled_encodings  # noqa: E402

use_bundled_encodings()  # tiktoken's files from LiteLLM's folder, offline

from bench_transcripts import TOOLS, Transcript, synthetic_session  # noqa: E402

from gateway.config import ModelSettings  # noqa: E402
from gateway.ops.tracing import OFF  # noqa: E402
from gateway.pipeline.assembly_bases import RecentAssemblies  # noqa: E402
from gateway.pipeline.request_path import _capture_and_project  # noqa: E402
from gateway.pipeline.run_recorder import RunRecorder  # noqa: E402
from gateway.wire.openai_chat import OpenAIChat  # noqa: E402
from policies.canonical import NodeIds  # noqa: E402
from policies.presets import preset  # noqa: E402
from storage.blobs import DirectoryBlobStore  # noqa: E402
from storage.database import make_engine  # noqa: E402
from storage.encryption import NO_ENCRYPTION, EncryptionKeys  # noqa: E402
from storage.record_types import RunOutcome, RunStart  # noqa: E402
from storage.records import RecordStore  # noqa: E402

MODEL = ModelSettings(name="fake", litellm_params={"model": "openai/fake", "api_base": "http://127.0.0.1:9"})
ANSWER = {"id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "fake",
          "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Done."}}],
          "usage": {"prompt_tokens": 1000, "completion_tokens": 3, "total_tokens": 1003}}


class _Metrics:
    def observe_run(self, *args: Any) -> None:
        pass


def timed(into: list[tuple[float, float]], work: Callable[..., Any]) -> Callable[..., Any]:
    """`work`, its (wall, CPU) milliseconds appended to `into` on every call."""
    @functools.wraps(work)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return work(*args, **kwargs)
        finally:
            into.append(((time.perf_counter() - started) * 1000, (time.thread_time() - cpu) * 1000))
    return wrapper


class Sealing:
    """The values an EncryptionKeys sealed (`seal`, `seal_text`; one count for a seal inside another) and
    the CPU seconds it took."""

    def __init__(self, keys: EncryptionKeys) -> None:
        self.values, self.cpu, self._inside = 0, 0.0, False
        for name in ("seal", "seal_text"):
            setattr(keys, name, self._metered(getattr(keys, name)))

    def _metered(self, work: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(plaintext: Any, aad: bytes) -> Any:
            if self._inside or plaintext is None:
                return work(plaintext, aad)
            self._inside, started = True, time.thread_time()
            try:
                return work(plaintext, aad)
            finally:
                self._inside = False
                self.values += 1
                self.cpu += time.thread_time() - started
        return wrapper


def replay(store: RecordStore, transcript: Transcript, requests: int, policy_name: str,
           tenant: str, sealing: Sealing | None = None) -> dict[str, list[tuple[float, float]]]:
    times: dict[str, list[tuple[float, float]]] = {"write": [], "read": [], "finish": []}
    sealed: list[tuple[float, float]] = []  # per request: (values sealed, CPU ms sealing)
    store._write_capture = timed(times["write"], store._write_capture)  # type: ignore[method-assign]
    store._read_after_capture = timed(times["read"], store._read_after_capture)  # type: ignore[method-assign]
    held: list[tuple[float, float]] = []  # SQLite: each transaction under the write lock, in order
    if store._group is not None:
        store._group._commit_held = timed(held, store._group._commit_held)  # type: ignore[method-assign]
    services = SimpleNamespace(node_ids=NodeIds(), tracing=OFF, clock=time.time)
    recent = RecentAssemblies()
    policy = preset(policy_name)
    wire = OpenAIChat()
    for number in range(requests):
        before = (sealing.values, sealing.cpu) if sealing else (0, 0.0)
        neutral = wire.parse(transcript.body(number // 2 if number % 2 else None))
        run = RunStart(request_id=f"req_{uuid.uuid4().hex}", tenant=tenant, participant="bench", model="fake",
                       upstream_model="openai/fake", stream=False, redact=policy.redaction.on_capture)
        recorder = RunRecorder(store, _Metrics(), run, {}, recent)  # type: ignore[arg-type]
        prepared = _capture_and_project(services, recorder, policy, MODEL, tenant, neutral, wire)  # type: ignore[arg-type]
        ingest, projection, record = prepared.ingest, prepared.projection, prepared.record
        assembly = recent.based(record, ingest.previous_request_id)
        outcome = RunOutcome(status="ok", latency_ms=1.0, http_status=200, prompt_tokens=1000, completion_tokens=3,
                             total_tokens=1003, tokens_original=projection.tokens_original,
                             tokens_forwarded=projection.tokens_forwarded, finish_reason="stop", response=ANSWER)
        timed(times["finish"], store.finish_run)(run.request_id, outcome, assembly)
        recent.remember(run.request_id, assembly)
        if sealing:
            sealed.append((sealing.values - before[0], (sealing.cpu - before[1]) * 1000))
    if sealing:
        times["sealed"] = sealed
    if held:  # one request, one after another: its capture's transaction, then its outcome's
        times["held"] = [(capture[0], outcome[0]) for capture, outcome in zip(held[0::2], held[1::2])]
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20, help="requests left out of the medians")
    parser.add_argument("--policy", default="coding-agent")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--url")
    parser.add_argument("--encrypt", action="store_true", help="seal what is stored under a random key")
    parser.add_argument("--link-delay-ms", dest="link_delay_ms", type=float, default=0,
                        help="with --url: reach the server through a relay that holds every chunk this long each"
                             " way (bench/delayed_link.py), as a database on another host")
    args = parser.parse_args()
    if args.link_delay_ms > 0:
        if not args.url:
            raise SystemExit("--link-delay-ms needs --url")
        from sqlalchemy.engine import make_url

        from delayed_link import DelayedLink
        url = make_url(args.url)
        link = DelayedLink(url.host or "127.0.0.1", url.port or 5432, args.link_delay_ms).__enter__()
        args.url = url.set(host="127.0.0.1", port=link.port).render_as_string(hide_password=False)
    print(f"command: {' '.join(sys.argv)}")
    print(f"backend: {'postgresql' if args.url else 'sqlite'}"
          f"{f' through a link holding each chunk {args.link_delay_ms:g} ms' if args.link_delay_ms else ''}; "
          f"policy {args.policy}; "
          f"{args.requests} requests per transcript, the first {args.warmup} left out; "
          f"{'sealed under a random key' if args.encrypt else 'no encryption key'}")
    print("median ms per request, wall (CPU of the calling thread: the SQLite commit's fsync is wall only)")
    print(f"{'transcript':>15} {'write':>15} {'read':>15} {'finish':>15} {'sum':>15}"
          + (f" {'sealed values, CPU ms: median (mean)':>38}" if args.encrypt else ""))
    for size in args.messages:
        transcript = Transcript(f"synthetic-{size}", synthetic_session(size, args.seed), TOOLS, False)
        with tempfile.TemporaryDirectory() as folder:
            keys = EncryptionKeys(os.urandom(32)) if args.encrypt else NO_ENCRYPTION
            store = RecordStore(make_engine(args.url or f"sqlite:///{folder}/bench.db"),
                                DirectoryBlobStore(Path(folder) / "blobs"), encryption=keys)
            store.create_schema()
            times = replay(store, transcript, args.requests + args.warmup, args.policy, f"bench-{size}",
                           Sealing(keys) if args.encrypt else None)
            store.engine.dispose()
        sealed = times.pop("sealed", [])[args.warmup:]
        held = times.pop("held", [])[args.warmup:]
        kept = {name: values[args.warmup:] for name, values in times.items()}
        cells = [(statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for v in kept.values()]
        cells.append((statistics.median(sum(t[i][0] for t in kept.values()) for i in range(args.requests)),
                      statistics.median(sum(t[i][1] for t in kept.values()) for i in range(args.requests))))
        seals = (f" {statistics.median(n for n, _ in sealed):>15.0f} ({statistics.mean(n for n, _ in sealed):.1f}),"
                 f" {statistics.median(c for _, c in sealed):.3f} ({statistics.mean(c for _, c in sealed):.3f})"
                 if sealed else "")
        print(f"{transcript.name:>15} " + " ".join(f"{f'{w:.2f} ({c:.2f})':>15}" for w, c in cells) + seals)
        if held:
            print(f"{'':>15} the write lock held (wall): {statistics.median(c for c, _ in held):.2f} ms by the"
                  f" capture, {statistics.median(o for _, o in held):.2f} ms by the outcome (medians)")


if __name__ == "__main__":
    main()
