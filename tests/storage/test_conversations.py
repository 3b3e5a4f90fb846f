"""Which requests are one conversation, at the store (SQLite and PostgreSQL).

The rule (policies.transcript.conversation_id_for): a label names a conversation; without one, its first
exchange does (the transcript up to the model's first answer, and that answer). A request before any
answer is its own conversation until its outcome brings the answer; `finish_run` then moves it into
the conversation that answer opens (storage/conversations.py), whether the client's next request was
captured before or after.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from policies.transcript import answer_fingerprint, label_conversation_id, message_path
from storage.record_types import RunOutcome, RunStart
from storage.records import RecordStore

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
HI = {"role": "user", "content": "hi"}
WORDS = ["hello", "sure", "the", "build", "passed", "what", "next", "ok", "file", "done"]
_NUMBERS = itertools.count()


def _request_id() -> str:
    return f"req_{next(_NUMBERS):032x}"


def _start(request_id: str, tenant: str, label: str | None = None, parent: str | None = None) -> RunStart:
    return RunStart(request_id=request_id, tenant=tenant, participant="p", model="fake", upstream_model="openai/fake",
                    stream=False, session_label=label, parent_request_id=parent)


def _ok(answer: dict[str, Any] | None) -> RunOutcome:
    return RunOutcome(status="ok", latency_ms=1.0, tokens_original=10, tokens_forwarded=10, answer=answer)


def _failed() -> RunOutcome:
    return RunOutcome(status="error", latency_ms=1.0, error_type="upstream_error", error_message="boom")


def _conversation_of(store: RecordStore, request_id: str) -> str:
    with store.engine.connect() as connection:
        return connection.execute(text("SELECT conversation_id FROM model_runs WHERE id = :id"),
                                  {"id": request_id}).scalar_one()


def _members(store: RecordStore, conversation: str) -> set[str]:
    with store.engine.connect() as connection:
        return set(connection.scalars(text("SELECT node_id FROM conversation_nodes WHERE conversation_id = :c"),
                                      {"c": conversation}))


def _conversation_rows(store: RecordStore, tenant: str) -> set[str]:
    with store.engine.connect() as connection:
        return set(connection.scalars(text("SELECT id FROM conversations WHERE tenant = :t"), {"t": tenant}))


# --- what the rule says, case by case --------------------------------------------------------------

def test_a_first_run_moves_into_the_conversation_its_answer_opens(store: RecordStore) -> None:
    first = [SYSTEM, HI]
    answer = {"role": "assistant", "content": "Hello! What shall we build?"}
    one = _request_id()
    captured = store.ingest(message_path("acme", first), _start(one, "acme"))
    assert captured.conversation_id == one  # its own, until the answer is known
    assert store.finish_run(one, _ok(answer))
    conversation = _conversation_of(store, one)
    assert conversation != one and _conversation_rows(store, "acme") == {conversation}
    assert _members(store, one) == set() and _members(store, conversation) == {n.id for n in message_path("acme", first)}
    two = _request_id()
    second = [*first, {**answer, "refusal": None, "annotations": []}, {"role": "user", "content": "a parser"}]
    assert store.ingest(message_path("acme", second), _start(two, "acme")).conversation_id == conversation
    assert store.conversation_openings([("acme", conversation)]) == {("acme", conversation): HI}


def test_the_next_request_captured_before_the_first_outcome_lands_in_the_same_conversation(
        store: RecordStore) -> None:
    """The answer reaches the client before its outcome is written: the client's next request comes first."""
    answer = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}
    one, two = _request_id(), _request_id()
    store.ingest(message_path("acme", [SYSTEM, HI]), _start(one, "acme"))
    later = [SYSTEM, HI, answer, {"role": "tool", "tool_call_id": "call_9", "content": "a.py\nb.py"}]
    conversation = store.ingest(message_path("acme", later), _start(two, "acme")).conversation_id
    store.finish_run(two, _ok(None))
    store.finish_run(one, _ok(answer))
    assert _conversation_of(store, one) == _conversation_of(store, two) == conversation
    assert _conversation_rows(store, "acme") == {conversation}


def test_a_first_run_without_an_answer_stays_alone(store: RecordStore) -> None:
    failed = _request_id()
    store.ingest(message_path("acme", [SYSTEM, HI]), _start(failed, "acme"))
    store.finish_run(failed, _failed())
    assert _conversation_of(store, failed) == failed
    assert store.conversation_openings([("acme", failed)]) == {("acme", failed): HI}  # named all the same
    assert store.delete_conversation("acme", failed)["model_runs"] == 1


def test_a_labelled_first_run_stays_in_its_label(store: RecordStore) -> None:
    one = _request_id()
    store.ingest(message_path("acme", [SYSTEM, HI]), _start(one, "acme", label="ticket-7"))
    store.finish_run(one, _ok({"role": "assistant", "content": "Hello"}))
    assert _conversation_of(store, one) == label_conversation_id("acme", "ticket-7")


def test_a_transcript_that_arrives_with_answers_is_its_first_exchange_from_the_start(store: RecordStore) -> None:
    """A history the gateway did not answer (imported, or from before): its first request already holds the
    first exchange, and its later requests follow it."""
    history = [SYSTEM, HI, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "more"}]
    one, two = _request_id(), _request_id()
    first = store.ingest(message_path("acme", history), _start(one, "acme")).conversation_id
    store.finish_run(one, _ok({"role": "assistant", "content": "More what?"}))  # no move: it had an answer
    history += [{"role": "assistant", "content": "More what?"}, {"role": "user", "content": "tests"}]
    assert store.ingest(message_path("acme", history), _start(two, "acme")).conversation_id == first
    assert _conversation_of(store, one) == first


def test_a_subagent_of_a_first_run_follows_it(store: RecordStore) -> None:
    one, child = _request_id(), _request_id()
    store.ingest(message_path("acme", [SYSTEM, HI]), _start(one, "acme"))
    store.ingest(message_path("acme", [{"role": "user", "content": "subtask"}]), _start(child, "acme", parent=one))
    store.finish_run(one, _ok({"role": "assistant", "content": "Hello"}))
    with store.engine.connect() as connection:
        linked = connection.execute(text("SELECT parent_conversation_id FROM model_runs WHERE id = :id"),
                                    {"id": child}).scalar_one()
    assert linked == _conversation_of(store, one) != one


# --- the rule over generated sessions (hypothesis) ------------------------------------------------

words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
call_ids = st.integers(0, 10 ** 9).map(lambda n: f"call_{n}")


@st.composite
def answers(draw: Any) -> dict[str, Any]:
    """A model's answer: text, or calls with ids of the model's own (and maybe some text)."""
    if draw(st.booleans()):
        return {"role": "assistant", "content": draw(words)}
    calls = [{"id": draw(call_ids), "type": "function",
              "function": {"name": draw(st.sampled_from(["ls", "cat"])), "arguments": json.dumps({"q": draw(words)})}}
             for _ in range(draw(st.integers(1, 2)))]
    return {"role": "assistant", "content": draw(st.none() | words), "tool_calls": calls}


@dataclass
class Turn:
    answer: dict[str, Any]
    failures: int  # tries before this answer that failed (an error, no answer)
    abandoned: dict[str, Any] | None  # a try answered, but the client never got it and tried again
    late: bool  # the outcome is written after the client's next request is captured
    follow_up: str  # the user's next message (after the tool results, if the answer made calls)


turns = st.builds(Turn, answer=answers(), failures=st.integers(0, 1), abandoned=st.none() | answers(),
                  late=st.booleans(), follow_up=words)
outputs = st.sampled_from(["a.py\nb.py", "the same export line", "Error: no such file"])


@dataclass
class Client:
    """One agent session: it sends its whole transcript each turn and appends what it was answered, as a
    client writes it back (SDK extras such as `refusal` included)."""

    tenant: str
    turns: list[Turn]
    outputs: list[str]
    messages: list[dict[str, Any]] = field(default_factory=lambda: [SYSTEM, HI])
    kept: list[str] = field(default_factory=list)  # runs whose answers the client went on with
    first_tries: list[str] = field(default_factory=list)  # tries of the first turn whose answer was not kept
    late: list[tuple[str, RunOutcome]] = field(default_factory=list)

    def steps(self, store: RecordStore) -> Iterator[None]:
        for number, turn in enumerate(self.turns):
            for outcome in [_failed()] * turn.failures + ([_ok(turn.abandoned)] if turn.abandoned else []):
                self._send(store, outcome, tried=number == 0)
                yield
            self._send(store, _ok(turn.answer), late=turn.late)
            self.messages.append({**turn.answer, "refusal": None})
            for call in turn.answer.get("tool_calls") or []:
                self.messages.append({"role": "tool", "tool_call_id": call["id"],
                                      "content": self.outputs[len(self.messages) % len(self.outputs)]})
            self.messages.append({"role": "user", "content": turn.follow_up})
            yield
        self._send(store, _ok(None))  # the transcript as the session ends: its last results go out too
        self._settle(store)

    def _send(self, store: RecordStore, outcome: RunOutcome, tried: bool = False, late: bool = False) -> None:
        request_id = _request_id()
        store.ingest(message_path(self.tenant, self.messages), _start(request_id, self.tenant))
        self._settle(store)  # what was answered before this request is written now (late) or was already
        (self.first_tries if tried else self.kept).append(request_id)
        if late:
            self.late.append((request_id, outcome))
        else:
            store.finish_run(request_id, outcome)

    def _settle(self, store: RecordStore) -> None:
        for request_id, outcome in self.late:
            store.finish_run(request_id, outcome)
        self.late.clear()


_TENANTS = itertools.count()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(alice=st.lists(turns, min_size=1, max_size=4), bob=st.lists(turns, min_size=1, max_size=4),
       outputs=st.lists(outputs, min_size=1, max_size=3), order=st.lists(st.booleans(), max_size=20))
def test_each_session_is_one_conversation_and_two_sessions_opening_alike_are_two(
        store: RecordStore, alice: list[Turn], bob: list[Turn], outputs: list[str], order: list[bool]) -> None:
    first_answers = [alice[0].answer, bob[0].answer] + [t.abandoned for t in (alice[0], bob[0]) if t.abandoned]
    assume(len({answer_fingerprint(a) for a in first_answers}) == len(first_answers))  # the model said each its own
    tenant = f"t{next(_TENANTS)}"
    clients = [Client(tenant, alice, outputs), Client(tenant, bob, outputs)]
    running = [client.steps(store) for client in clients]
    for pick in itertools.chain(order, itertools.cycle([False, True])):  # interleaved, then each in turn
        if not running:
            break
        step = running[int(pick) % len(running)]
        if next(step, "done") == "done":
            running.remove(step)
    conversations = []
    for client in clients:
        mine = {_conversation_of(store, r) for r in client.kept}
        assert len(mine) == 1, "every request whose answer the session went on with, the first one too"
        conversations.append(mine.pop())
        for tried in client.first_tries:  # a first try that was not answered, or whose answer went nowhere
            assert _conversation_of(store, tried) not in conversations
    assert conversations[0] != conversations[1]
    assert store.conversation_openings([(tenant, c) for c in conversations]) == {(tenant, c): HI for c in conversations}
    with store.engine.connect() as connection:  # every tool result captured once, on its own node
        artifacts = connection.execute(text("SELECT count(*) FROM tool_artifacts WHERE tenant = :t"),
                                       {"t": tenant}).scalar_one()
    results = {n.id for c in clients for n in message_path(tenant, c.messages) if n.message["role"] == "tool"}
    assert artifacts == len(results)
    # One of them deleted, the other whole: they share only the opening's nodes.
    store.delete_conversation(tenant, conversations[0])
    assert all(store.get_run(r, tenant) is not None for r in clients[1].kept)
    assert all(store.get_run(r, tenant) is None for r in clients[0].kept)
    last = store.get_run(clients[1].kept[-1], tenant)
    assert last is not None and len(store.path_messages(last.run["leaf_node_id"])) == last.run["message_count"]


# --- existing conversations after the upgrade -----------------------------------------------------

def test_0014_names_the_conversations_it_finds(storage_url: str, tmp_path: Path) -> None:
    """Before 0014 an unlabelled conversation's id was the node of its first message after the system
    prompt: rows whose id is a user message's node are named by it."""
    from alembic import command
    from alembic.config import Config as AlembicConfig

    from testkit.gateway import make_store

    store = make_store(storage_url, tmp_path / "blobs")
    try:
        legacy = message_path("acme", [SYSTEM, HI, {"role": "assistant", "content": "Hello"},
                                       {"role": "user", "content": "more"}])
        store.ingest(legacy, _start("req_legacy", "acme"))
        labelled = message_path("acme", [SYSTEM, {"role": "user", "content": "ticket work"}])
        store.ingest(labelled, _start("req_label", "acme", label="ticket-1"))
        config = AlembicConfig()
        config.set_main_option("script_location", str(Path(__file__).resolve().parents[2] / "storage" / "migrations"))
        with store.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0013")
            # as the rule before left them: the node of the first message after the system prompt
            connection.execute(text("UPDATE model_runs SET conversation_id = :c WHERE id = 'req_legacy'"),
                               {"c": legacy[1].id})
            connection.execute(text("UPDATE conversations SET id = :c WHERE id <> :label"),
                               {"c": legacy[1].id, "label": label_conversation_id("acme", "ticket-1")})
        store.create_schema()  # back to head: 0014 fills opening_node_id in
        openings = store.conversation_openings([("acme", legacy[1].id), ("acme", label_conversation_id("acme", "ticket-1"))])
        assert openings == {("acme", legacy[1].id): HI}  # a labelled one is named by its label
        assert store.delete_conversation("acme", legacy[1].id)["model_runs"] == 1  # still what it was
    finally:
        store.engine.dispose()


@pytest.mark.parametrize("content", ["plain", [{"type": "text", "text": "parts"}]])
def test_openings_are_read_sealed_and_left_out_when_their_key_is_missing(storage_url: str, tmp_path: Path,
                                                                         content: Any) -> None:
    from storage.database import make_engine
    from storage.blobs import DirectoryBlobStore
    from storage.encryption import EncryptionKeys

    def store_with(*keys: bytes) -> RecordStore:
        store = RecordStore(make_engine(storage_url), DirectoryBlobStore(tmp_path / "blobs"),
                            encryption=EncryptionKeys(keys[0], keys[1:]))
        store.create_schema()
        return store

    first, second = b"k" * 32, b"j" * 32
    sealing, other, both = store_with(first), store_with(second), store_with(second, first)
    try:
        one = _request_id()
        opening = {"role": "user", "content": content}
        sealing.ingest(message_path("acme", [opening]), _start(one, "acme"))
        with sealing.engine.connect() as connection:
            stored = connection.execute(text("SELECT message_json FROM message_nodes")).scalar_one()
        assert "parts" not in stored and "plain" not in stored  # sealed at rest
        assert both.conversation_openings([("acme", one), ("globex", one)]) == {("acme", one): opening}
        assert other.conversation_openings([("acme", one)]) == {}  # not readable here: named by its id
    finally:
        for store in (sealing, other, both):
            store.engine.dispose()
