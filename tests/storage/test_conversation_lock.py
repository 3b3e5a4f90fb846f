"""The conversation row a capture locks on PostgreSQL (storage/capture.py `_hold_conversation`): captures of
an active conversation share it, while collection and deletion, which take it exclusively, still wait for
a capture, and a conversation new or idle is touched (its last activity moved) as before."""
from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import select, text

from policies.transcript import conversation_id_for, message_path
from storage.capture import ACTIVE_WINDOW
from storage.record_types import RunStart, as_utc
from storage.records import RecordStore
from storage.schema import Conversation
from testkit.gateway import make_store

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc).timestamp()
MESSAGES = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": "on it"}, {"role": "user", "content": "go"}]  # one conversation


@pytest.fixture
def store(postgres_url: str, tmp_path: Path) -> Iterator[RecordStore]:
    store = make_store(postgres_url, tmp_path / "blobs")
    store.clock = lambda: T0
    yield store
    store.engine.dispose()


def _capture(store: RecordStore, number: int, extra: int = 0) -> None:
    messages = MESSAGES + [{"role": "user", "content": f"and then {n}"} for n in range(extra)]
    store.ingest(message_path("acme", messages), RunStart(
        request_id=f"req_{number:032x}", tenant="acme", participant="p", model="fake", upstream_model="openai/fake",
        stream=False))


def _conversation() -> str:
    return conversation_id_for("acme", None, message_path("acme", MESSAGES), "req_unused")


def _last_active(store: RecordStore) -> datetime:
    with store.engine.connect() as connection:
        return as_utc(connection.scalar(select(Conversation.last_active_at).where(Conversation.id == _conversation())))


def _capture_in_thread(store: RecordStore, number: int) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _capture(store, number, extra=number)
        except BaseException as exc:  # reported to the test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_a_capture_of_an_active_conversation_does_not_wait_for_another_capture(store: RecordStore) -> None:
    _capture(store, 1)
    first = _last_active(store)
    with store.engine.connect() as other:  # another capture of the conversation, still open
        other.execute(text("SELECT id FROM conversations WHERE id = :id FOR SHARE"), {"id": _conversation()})
        thread, errors = _capture_in_thread(store, 2)
        thread.join(10)
        assert not thread.is_alive() and not errors  # it went on while the other held the row
        other.rollback()
    assert _last_active(store) == first  # within the window: shared, not touched


def test_a_capture_waits_for_collection_or_deletion_holding_the_row(store: RecordStore) -> None:
    _capture(store, 1)
    with store.engine.connect() as collector:  # the claim garbage collection makes (an UPDATE)
        collector.execute(text("UPDATE conversations SET collected = collected WHERE id = :id"),
                          {"id": _conversation()})
        thread, errors = _capture_in_thread(store, 2)
        thread.join(1.0)
        assert thread.is_alive()  # waiting for the row
        collector.commit()
    thread.join(10)
    assert not thread.is_alive() and not errors


def test_an_idle_conversation_is_touched(store: RecordStore) -> None:
    _capture(store, 1)
    assert _last_active(store).timestamp() == T0
    later = T0 + ACTIVE_WINDOW.total_seconds() + 5
    store.clock = lambda: later
    _capture(store, 2, extra=1)
    assert _last_active(store).timestamp() == later


def test_a_conversation_collected_from_is_touched_and_cleared(store: RecordStore) -> None:
    _capture(store, 1)
    with store.engine.begin() as connection:
        connection.execute(text("UPDATE conversations SET collected = 4 WHERE id = :id"), {"id": _conversation()})
    _capture(store, 2, extra=1)  # within the window, but partly collected: the touch clears it
    with store.engine.connect() as connection:
        assert connection.scalar(select(Conversation.collected).where(Conversation.id == _conversation())) == 0
