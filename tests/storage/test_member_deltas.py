"""PostgreSQL's count of a conversation's tool results without the join (storage/artifact_members.py):
captures that only share-lock the conversation leave delta rows, one that holds it exclusively folds
them into its figure, and one that finds many gathers them into one. Whatever the order, and with
captures of one conversation running at once, the figure plus the rows is the join's count."""
from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import func, select

from policies.transcript import message_path
from storage.artifact_members import _ALL_ARTIFACT_MEMBERS, GATHER_ROWS
from storage.capture import ACTIVE_WINDOW
from storage.conversation_reads import SIBLING_COUNT_BOUND
from storage.record_types import IngestResult, RunOutcome, RunStart
from storage.records import RecordStore
from storage.retention import RetentionClasses, run_gc
from storage.schema import Conversation, ConversationMemberDelta
from testkit.gateway import make_store

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=timezone.utc).timestamp()
OPENING = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
_DELTAS = ConversationMemberDelta.__table__


def _round(n: int) -> list[dict]:
    return [{"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {n}}}'}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": f"output {n}"}]


def _rounds(numbers: range | list[int]) -> list[dict]:
    return [m for n in numbers for m in _round(n)]


@pytest.fixture
def store(postgres_url: str, tmp_path: Path) -> Iterator[RecordStore]:
    store = make_store(postgres_url, tmp_path / "blobs")
    store.clock = lambda: T0  # every capture after the first within the active window: share-locked
    yield store
    store.engine.dispose()


def _ingest(store: RecordStore, messages: list[dict], n: int) -> IngestResult:
    run = RunStart(request_id=f"req_{n:032x}", tenant="acme", participant="p", model="fake",
                   upstream_model="openai/fake", stream=False, session_label="task")
    return store.ingest(message_path("acme", messages), run)


def _state(store: RecordStore, conversation: str) -> tuple[int | None, int, int, int]:
    """(the figure on the conversation's row, its delta rows, what they add, the join's count)."""
    with store.engine.connect() as connection:
        figure = connection.scalar(select(Conversation.artifact_members).where(Conversation.id == conversation))
        rows, added = connection.execute(select(func.count(), func.coalesce(func.sum(_DELTAS.c.added), 0))
                                         .where(_DELTAS.c.conversation_id == conversation)).one()
        joined = connection.scalar(_ALL_ARTIFACT_MEMBERS, {"conversation": conversation})
    return figure, int(rows), int(added), int(joined)


def test_shared_captures_leave_rows_and_an_exclusive_one_folds_them(store: RecordStore) -> None:
    first = _ingest(store, [*OPENING, *_rounds(range(2))], 1)
    conversation = first.conversation_id
    assert _state(store, conversation) == (2, 0, 0, 2)  # new: taken exclusively and counted
    for n in range(2, 6):  # each adds one result under a share lock
        result = _ingest(store, [*OPENING, *_rounds(range(n + 1))], n)
        assert result.sibling_artifacts == 0
    assert _state(store, conversation) == (2, 4, 4, 6)
    resent = _ingest(store, [*OPENING, *_rounds(range(6))], 6)  # nothing new: no row
    assert _state(store, conversation) == (2, 4, 4, 6) and resent.sibling_artifacts == 0
    branch = _ingest(store, [*OPENING, *_rounds(range(3)), *_rounds([90])], 7)
    assert branch.sibling_artifacts == 3  # rounds 3, 4 and 5 are off its path
    store.clock = lambda: T0 + 2 * ACTIVE_WINDOW.total_seconds()  # idle: taken exclusively, folded
    later = _ingest(store, [*OPENING, *_rounds(range(7))], 8)
    assert _state(store, conversation) == (8, 0, 0, 8)
    assert later.sibling_artifacts == 1  # the branch's


def test_many_rows_are_gathered_into_one(store: RecordStore) -> None:
    conversation = _ingest(store, [*OPENING, *_rounds(range(1))], 0).conversation_id
    seen_rows = []
    for n in range(1, GATHER_ROWS + 12):
        result = _ingest(store, [*OPENING, *_rounds(range(n + 1))], n)
        figure, rows, added, joined = _state(store, conversation)
        assert figure + added == joined == n + 1
        assert result.sibling_artifacts == 0
        seen_rows.append(rows)
    # the capture whose read found more than GATHER_ROWS gathered them, its own with them
    assert max(seen_rows) == GATHER_ROWS and seen_rows[GATHER_ROWS] == 1
    assert seen_rows[-1] == 1 + len(seen_rows) - (GATHER_ROWS + 1)


def test_a_figure_missing_under_a_share_lock_is_counted_exclusively(store: RecordStore) -> None:
    """A row without a figure (migrated, adopted, claimed) is never share-locked: the capture takes it
    exclusively and counts."""
    conversation = _ingest(store, [*OPENING, *_rounds(range(3))], 1).conversation_id
    _ingest(store, [*OPENING, *_rounds(range(4))], 2)
    with store.engine.begin() as connection:
        connection.execute(Conversation.__table__.update().values(artifact_members=None))
    result = _ingest(store, [*OPENING, *_rounds(range(5))], 3)
    assert _state(store, conversation) == (5, 0, 0, 5) and result.sibling_artifacts == 0


def test_captures_running_at_once_keep_the_count(store: RecordStore) -> None:
    """Eight threads capture branches of one active conversation at once (share locks, delta rows,
    gathering): none fails or waits on another for good, and the count is the join's after them."""
    main = [*OPENING, *_rounds(range(4))]
    conversation = _ingest(store, main, 0).conversation_id
    start = threading.Barrier(8)
    errors: list[BaseException] = []
    told: list[tuple[int, int]] = []

    def capture(worker: int) -> None:
        try:
            start.wait(10)
            for k in range(12):
                own = [1000 * worker + j for j in range(k + 1)]
                result = _ingest(store, [*main, *_rounds(own)], 100 * worker + k + 1)
                told.append((result.sibling_artifacts, len(result.path_artifact_ids)))
        except BaseException as exc:  # reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=capture, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads) and not errors
    figure, rows, added, joined = _state(store, conversation)
    assert figure is not None and figure + added == joined == 4 + 8 * 12
    assert len(told) == 8 * 12 and all(0 <= s <= joined - p for s, p in told)
    result = _ingest(store, main, 999)  # once they are all in, exactly the others' results
    assert result.sibling_artifacts == 8 * 12 == min(joined, SIBLING_COUNT_BOUND + len(main)) - 4


def test_rows_go_with_their_conversation(store: RecordStore) -> None:
    conversation = _ingest(store, [*OPENING, *_rounds(range(1))], 1).conversation_id
    _ingest(store, [*OPENING, *_rounds(range(3))], 2)
    assert _state(store, conversation)[1] == 1
    assert store.delete_conversation("acme", conversation)
    assert _state(store, conversation) == (None, 0, 0, 0)


def test_retentions_claim_is_counted_again_after_it(store: RecordStore) -> None:
    main = [*OPENING, *_rounds(range(3))]
    conversation = _ingest(store, main, 1).conversation_id
    _ingest(store, [*main, *_rounds([3])], 2)  # a delta row
    store.finish_run(f"req_{2:032x}", RunOutcome(status="ok", latency_ms=1.0, tokens_original=10))
    run_gc(store, lambda tenant: RetentionClasses(artifacts=timedelta(days=1)),
           datetime.fromtimestamp(T0, timezone.utc) + timedelta(days=2))
    assert _state(store, conversation)[0] is None and _state(store, conversation)[3] == 0
    later = _ingest(store, [*main, *_rounds([3, 4])], 3)  # collected from: taken exclusively, counted
    assert _state(store, conversation) == (5, 0, 0, 5) and later.sibling_artifacts == 0


def test_a_tenant_purge_removes_the_rows(store: RecordStore) -> None:
    conversation = _ingest(store, [*OPENING, *_rounds(range(1))], 1).conversation_id
    _ingest(store, [*OPENING, *_rounds(range(2))], 2)
    assert store.tenant_row_counts("acme")["conversation_member_deltas"] == 1
    purged = store.purge_tenant("acme", actor="test")
    assert purged.counts["conversation_member_deltas"] == 1
    assert _state(store, conversation) == (None, 0, 0, 0)
