"""Retention and garbage collection on the record store, with the clock moved forward (storage/retention.py)."""
from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import func, select

from policies.transcript import artifact_id_for, message_path
from storage.blobs import DirectoryBlobStore
from storage.database import make_engine
from storage.gc_lock import exclusive
from storage.record_types import RunOutcome, RunStart
from storage.records import RecordStore
from storage.retention import RetentionClasses, parse_duration, run_gc
from storage.schema import Base

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)
FILLER = "".join(f"line {i}: the build printed something long enough to leave the row\n" for i in range(40))


class Clock:
    def __init__(self, moment: datetime) -> None:
        self.moment = moment

    def __call__(self) -> float:
        return self.moment.timestamp()


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def store(storage_url: str, tmp_path: Path, clock: Clock) -> Iterator[RecordStore]:
    store = RecordStore(make_engine(storage_url), DirectoryBlobStore(tmp_path / "blobs"), inline_max_bytes=1024,
                        clock=clock)
    store.create_schema()
    yield store
    store.engine.dispose()


def conversation(opening: str, output: str) -> list[dict]:
    return [{"role": "user", "content": opening},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "build", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": output}]


def request(store: RecordStore, clock: Clock, tenant: str, label: str, messages: list[dict],
            tokens: int = 1000) -> str:
    """One finished request of conversation `label` at the clock's time; its run id."""
    run = RunStart(request_id=f"req_{uuid.uuid4().hex}", tenant=tenant, participant="p", model="fake",
                   upstream_model="openai/fake", stream=False, session_label=label, started_at=clock.moment)
    store.ingest(message_path(tenant, messages), run)
    store.finish_run(run.request_id, RunOutcome(status="ok", latency_ms=5, prompt_tokens=tokens // 4,
                                                completion_tokens=7, total_tokens=tokens // 4 + 7, cost_usd=0.25,
                                                cost_original_usd=1.0, tokens_original=tokens,
                                                tokens_forwarded=tokens // 4))
    return run.request_id


def row_counts(store: RecordStore) -> dict[str, int]:
    with store.engine.connect() as connection:
        return {t.name: connection.scalar(select(func.count()).select_from(t)) for t in Base.metadata.sorted_tables}


def blob_files(store: RecordStore) -> set[str]:
    return {p.name for p in store.blobs.root.rglob("*") if p.is_file() and not p.name.startswith(".")}


def everything(days: int) -> RetentionClasses:
    lifetime = timedelta(days=days)
    return RetentionClasses(artifacts=lifetime, memories=lifetime, assemblies=lifetime, runs=lifetime)


def test_durations() -> None:
    assert parse_duration("30d") == timedelta(days=30) and parse_duration("12h") == timedelta(hours=12)
    assert parse_duration(None) is None
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("30 days")


def test_gc_removes_exactly_the_conversations_idle_past_their_lifetime(store: RecordStore, clock: Clock) -> None:
    old_output, shared_output = "old build output\n" + FILLER, "shared opening output\n" + FILLER
    old = request(store, clock, "acme", "old", conversation("Build the old thing.", old_output))
    request(store, clock, "acme", "kept", conversation("Build the new thing.", "new output\n" + FILLER))
    # a conversation that begins as the idle one does, still in use: the nodes they share stay
    request(store, clock, "acme", "idle-twin", conversation("Build the twin.", shared_output))
    clock.moment = T0 + 20 * DAY
    twin = conversation("Build the twin.", shared_output) + [{"role": "assistant", "content": "built"},
                                                             {"role": "user", "content": "again"}]
    request(store, clock, "acme", "active-twin", twin)
    request(store, clock, "acme", "kept", conversation("Build the new thing.", "new output\n" + FILLER)
            + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}])
    before = row_counts(store)
    savings = store.savings_rows(None)
    blobs = blob_files(store)

    report = run_gc(store, lambda tenant: everything(30), T0 + 35 * DAY)

    assert not report.skipped
    # "old" and "idle-twin" went idle at T0; "kept" and "active-twin" were used at T0 + 20d
    assert report.counts["model_runs"] == 2 and report.rolled_up == 2
    assert report.counts["tool_artifacts"] == 1 and report.counts["message_nodes"] == 3  # old's; the twin's are shared
    assert report.counts["conversation_nodes"] == 6 and report.counts["conversations"] == 2
    assert report.counts["blobs"] == 1
    after = row_counts(store)
    assert before["model_runs"] - after["model_runs"] == 2 and after["savings_ledger"] >= 1
    assert blobs - blob_files(store) == {artifact_key(store, old_output)}
    assert store.get_run(old, "acme") is None
    shared = store.get_artifact(artifact_id_for(message_path("acme", twin)[2].id), "acme")
    assert shared is not None and store.artifact_bytes(shared) == shared_output.encode()
    assert sorted(store.savings_rows(None), key=repr) == sorted(savings, key=repr)  # totals unmoved
    assert sum(r["requests"] for r in store.savings_rows("acme")) == 5

    again = run_gc(store, lambda tenant: everything(30), T0 + 35 * DAY)
    assert sum(again.counts.values()) == 0 and row_counts(store) == after


def artifact_key(store: RecordStore, output: str) -> str:
    import hashlib

    return hashlib.sha256(output.encode()).hexdigest()


def test_each_class_has_its_own_lifetime(store: RecordStore, clock: Clock) -> None:
    run_id = request(store, clock, "acme", "c", conversation("Build it.", "output\n" + FILLER))
    classes = RetentionClasses(artifacts=timedelta(days=10), runs=timedelta(days=40))
    report = run_gc(store, lambda tenant: classes, T0 + 9 * DAY)
    assert sum(report.counts.values()) == 0
    report = run_gc(store, lambda tenant: classes, T0 + 11 * DAY)
    assert report.counts["tool_artifacts"] == 1 and "model_runs" not in report.counts
    assert store.get_run(run_id, "acme") is not None  # the run record outlives the transcript
    report = run_gc(store, lambda tenant: classes, T0 + 41 * DAY)
    assert report.counts["model_runs"] == 1
    assert "conversations" not in report.counts  # memories and assemblies are kept forever: so is its row
    assert row_counts(store)["conversations"] == 1


def test_a_conversation_used_again_starts_its_lifetimes_over(store: RecordStore, clock: Clock) -> None:
    messages = conversation("Build it.", "output\n" + FILLER)
    request(store, clock, "acme", "c", messages)
    assert run_gc(store, lambda tenant: everything(30), T0 + 31 * DAY).counts["tool_artifacts"] == 1
    clock.moment = T0 + 32 * DAY  # the client comes back with its transcript: captured anew
    request(store, clock, "acme", "c", messages + [{"role": "assistant", "content": "ok"}])
    assert sum(run_gc(store, lambda tenant: everything(30), T0 + 61 * DAY).counts.values()) == 0
    record = store.get_artifact(artifact_id_for(message_path("acme", messages)[2].id), "acme")
    assert record is not None and store.artifact_bytes(record) == messages[2]["content"].encode()


def test_tenants_have_their_own_classes(store: RecordStore, clock: Clock) -> None:
    request(store, clock, "acme", "a", conversation("Build it.", "acme output"))
    request(store, clock, "globex", "g", conversation("Build it.", "globex output"))
    classes = {"acme": RetentionClasses(runs=timedelta(days=1))}
    report = run_gc(store, lambda tenant: classes.get(tenant, RetentionClasses()), T0 + 2 * DAY)
    assert report.counts == {"context_assemblies": 0, "model_runs": 1}
    assert [r["tenant"] for r in store.recent_runs(None)] == ["globex"]


def test_dry_run_counts_what_a_run_removes_and_removes_nothing(store: RecordStore, clock: Clock) -> None:
    for i in range(5):
        request(store, clock, "acme", f"c{i}", conversation(f"Build {i}.", f"output {i}\n" + FILLER))
    before, blobs = row_counts(store), blob_files(store)
    dry = run_gc(store, lambda tenant: everything(1), T0 + 2 * DAY, dry_run=True, batch_size=2)
    assert row_counts(store) == before and blob_files(store) == blobs
    real = run_gc(store, lambda tenant: everything(1), T0 + 2 * DAY, batch_size=2)
    assert dry.counts == real.counts and dry.rolled_up == real.rolled_up == 5
    assert real.counts["blobs"] == 5 and not blob_files(store)


def test_a_held_lock_makes_another_run_do_nothing(store: RecordStore, clock: Clock) -> None:
    request(store, clock, "acme", "c", conversation("Build it.", "output"))
    with exclusive(store.engine) as held:
        assert held
        assert run_gc(store, lambda tenant: everything(1), T0 + 2 * DAY).skipped
    assert run_gc(store, lambda tenant: everything(1), T0 + 2 * DAY).counts["model_runs"] == 1


def test_two_concurrent_runs_one_does_the_work(storage_url: str, store: RecordStore, clock: Clock,
                                               tmp_path: Path) -> None:
    for i in range(20):
        request(store, clock, "acme", f"c{i}", conversation(f"Build {i}.", f"output {i}\n" + FILLER))
    # a second process's store: its own engine (and connections) over the same database and blob folder
    other = RecordStore(make_engine(storage_url), DirectoryBlobStore(tmp_path / "blobs"), clock=clock)
    reached, release = threading.Event(), threading.Event()
    original = store._delete_class

    def paused(*args, **kwargs):  # the first run stops inside its first batch, holding the lock
        reached.set()
        assert release.wait(30)
        return original(*args, **kwargs)

    store._delete_class = paused  # type: ignore[method-assign]
    reports = {}
    first = threading.Thread(target=lambda: reports.update(first=run_gc(store, lambda t: everything(1), T0 + 2 * DAY)))
    first.start()
    assert reached.wait(30)
    reports["second"] = run_gc(other, lambda t: everything(1), T0 + 2 * DAY)
    release.set()
    first.join(30)
    other.engine.dispose()
    assert reports["second"].skipped and not reports["second"].counts
    assert reports["first"].counts["model_runs"] == 20 and reports["first"].counts["blobs"] == 20
    assert row_counts(store)["model_runs"] == 0
