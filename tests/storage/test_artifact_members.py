"""storage/artifact_members.py: the count of a conversation's tool results that SQLite keeps on its row
is, after every capture, the count the join of its memberships gives (resends, branches, a row not
counted yet, retention's claim, a first run adopted); and what the assembly is told of sibling
branches is what that join gives, on SQLite and on PostgreSQL."""
from __future__ import annotations

import itertools
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, update

from policies.transcript import message_path
from storage.artifact_members import _ALL_ARTIFACT_MEMBERS
from storage.conversation_reads import SIBLING_COUNT_BOUND
from storage.record_types import IngestResult, RunOutcome, RunStart
from storage.records import RecordStore
from storage.retention import RetentionClasses, run_gc
from storage.schema import Conversation
from testkit.gateway import make_store

_TABLE = Conversation.__table__
OPENING = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]


def _round(n: int) -> list[dict]:
    return [{"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {n}}}'}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": f"output {n}"}]


def _ingest(store: RecordStore, messages: list[dict], n: int, label: str | None = None) -> IngestResult:
    run = RunStart(request_id=f"req_{n:032x}", tenant="acme", participant="p", model="fake",
                   upstream_model="openai/fake", stream=False, session_label=label)
    return store.ingest(message_path("acme", messages), run)


def _joined(store: RecordStore, conversation: str) -> int:
    with store.engine.connect() as connection:
        return int(connection.scalar(_ALL_ARTIFACT_MEMBERS, {"conversation": conversation}))


def _kept(store: RecordStore, conversation: str) -> int | None:
    with store.engine.connect() as connection:
        return connection.scalar(select(_TABLE.c.artifact_members).where(_TABLE.c.id == conversation))


def _siblings_as_joined(store: RecordStore, result: IngestResult, path_length: int) -> int:
    counted = min(_joined(store, result.conversation_id), SIBLING_COUNT_BOUND + path_length)
    return max(0, counted - len(result.path_artifact_ids))


# A request: how many rounds of the main line it holds, then how many of its own branch's.
_requests = st.lists(st.tuples(st.integers(0, 8), st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=10)


@settings(max_examples=30, deadline=None)
@given(requests=_requests, forget_at=st.integers(0, 12))
def test_the_kept_count_is_the_joined_one_after_every_capture(requests: list[tuple[int, int, int]],
                                                               forget_at: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = make_store(f"sqlite:///{folder}/gateway.db", Path(folder) / "blobs")
        try:
            for n, (main, branch, extra) in enumerate(requests):
                if n == forget_at:  # as a migrated row: not counted yet
                    with store.engine.begin() as connection:
                        connection.execute(update(_TABLE).values(artifact_members=None))
                messages = [*OPENING, *(m for k in range(main) for m in _round(k)),
                            *(m for k in range(extra) for m in _round(100 * branch + 1000 + k))]
                result = _ingest(store, messages, n, label="task")
                assert _kept(store, result.conversation_id) == _joined(store, result.conversation_id)
                assert result.sibling_artifacts == _siblings_as_joined(store, result, len(messages))
        finally:
            store.engine.dispose()


def test_siblings_are_the_joined_count_on_both_databases(store: RecordStore) -> None:
    main = [*OPENING, *(m for k in range(6) for m in _round(k))]
    first = _ingest(store, main, 1, label="task")
    assert first.sibling_artifacts == 0
    branch = _ingest(store, [*main[:6], *_round(50), *_round(51)], 2, label="task")
    assert branch.sibling_artifacts == 4 == _siblings_as_joined(store, branch, 8)  # rounds 2..5 are off it
    again = _ingest(store, main, 3, label="task")  # the main line resent: the branch's two are siblings
    assert again.sibling_artifacts == 2 == _siblings_as_joined(store, again, len(main))


def test_retentions_claim_has_the_next_capture_count_again(store: RecordStore) -> None:
    main = [*OPENING, *(m for k in range(3) for m in _round(k))]
    result = _ingest(store, main, 1, label="task")
    store.finish_run(f"req_{1:032x}", RunOutcome(status="ok", latency_ms=1.0, tokens_original=10))
    run_gc(store, lambda tenant: RetentionClasses(artifacts=timedelta(days=1)),
           datetime.fromtimestamp(store.clock(), timezone.utc) + timedelta(days=2))
    assert _kept(store, result.conversation_id) is None and _joined(store, result.conversation_id) == 0
    later = _ingest(store, [*main, *_round(3)], 2, label="task")
    assert later.sibling_artifacts == 0
    if not store.is_postgresql:
        assert _kept(store, later.conversation_id) == _joined(store, later.conversation_id) == 4


def test_a_first_run_adopted_into_its_conversation_is_counted(store: RecordStore) -> None:
    """An unlabelled conversation's first run lives in a conversation of its own id until it is answered,
    then its memberships move (storage/conversations.py `_adopt_first_run`): the count follows them."""
    first = _ingest(store, [*OPENING, *_round(0), *_round(1)], 1)
    store.finish_run(f"req_{1:032x}", RunOutcome(status="ok", latency_ms=1.0, tokens_original=10))
    later = _ingest(store, [*OPENING, *_round(0), *_round(1), *_round(2)], 2)
    assert later.sibling_artifacts == _siblings_as_joined(store, later, 8) == 0
    assert _joined(store, later.conversation_id) == 3
    if not store.is_postgresql:
        assert _kept(store, later.conversation_id) == 3
    assert first.conversation_id in (later.conversation_id, f"req_{1:032x}")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=_requests)
def test_siblings_are_the_joined_count_after_any_requests(store: RecordStore,
                                                         requests: list[tuple[int, int, int]]) -> None:
    """Branches drawn at random, on both databases (SQLite keeps a figure; PostgreSQL a figure and the
    delta rows of captures that only share-locked the conversation: tests/storage/test_member_deltas.py):
    the siblings told after every capture are what the join gives."""
    example = next(_EXAMPLES)
    label = f"task-{example}"  # a conversation of its own per example (the store is shared)
    for n, (main, branch, extra) in enumerate(requests):
        messages = [*OPENING, *(m for k in range(main) for m in _round(k)),
                    *(m for k in range(extra) for m in _round(100 * branch + 1000 + k))]
        result = _ingest(store, messages, 1_000 * example + n, label=label)
        assert result.sibling_artifacts == _siblings_as_joined(store, result, len(messages))


_EXAMPLES = itertools.count(1)
