"""The capture's reads of a path take lists longer than PostgreSQL's 65,535 bind parameters (issue 27),
on SQLite and on the real PostgreSQL: each list is one parameter, and the answer is the one the stored
ids alone give."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import select

from policies.transcript import artifact_id_for, conversation_id_for, message_path
from storage.blobs import DirectoryBlobStore
from storage.artifact_members import _ALL_ARTIFACT_MEMBERS
from storage.conversation_reads import SIBLING_COUNT_BOUND
from storage.database import make_engine
from storage.record_types import IngestResult, RunOutcome, RunStart
from storage.records import RecordStore
from storage.retention import RetentionClasses, run_gc
from storage.schema import Conversation
from testkit.gateway import make_store

PAST_THE_BIND_LIMIT = 70_000  # psycopg refuses a statement of more than 65,535 parameters


def _round(n: int) -> list[dict]:
    return [{"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {n}}}'}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": f"output {n}"}]


def _run(n: int, participant: str = "p", parent: str | None = None) -> RunStart:
    return RunStart(request_id=f"req_{n:032x}", tenant="acme", participant=participant, model="fake",
                    upstream_model="openai/fake", stream=False, parent_request_id=parent)


def _padded(ids: list[str]) -> list[str]:
    """`ids` among made-up ids (a path's length past the bind limit), the real ones spread through."""
    made_up = [f"{n:032x}" for n in range(PAST_THE_BIND_LIMIT - len(ids))]
    step = len(made_up) // (len(ids) + 1)
    out: list[str] = []
    for k, real in enumerate(ids):
        out += made_up[k * step:(k + 1) * step] + [real]
    return out + made_up[len(ids) * step:]


def test_every_path_read_takes_more_ids_than_the_bind_limit(store: RecordStore) -> None:
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
    for n in range(40):
        messages += _round(n)
        store.ingest(message_path("acme", messages), _run(n, participant=f"p{n % 3}"))
        if n % 5 == 0:
            store.finish_run(f"req_{n:032x}", RunOutcome(status="ok", latency_ms=1.0, tokens_original=n + 1))
    child = message_path("acme", [{"role": "user", "content": "subtask"}, *_round(99)])
    store.ingest(child, _run(1000, parent=f"req_{39:032x}"))  # a subagent whose parent ran in the conversation
    path = message_path("acme", messages)
    ids = [node.id for node in path]
    artifacts = [artifact_id_for(node.id) for node in path if node.message["role"] == "tool"]
    conversation = conversation_id_for("acme", None, path, "req_unused")
    assert len(_padded(ids)) == PAST_THE_BIND_LIMIT and set(_padded(ids)) >= set(ids)
    with store.engine.connect() as connection:
        assert store._node_states(connection, conversation, _padded(ids)) == (set(ids), set(ids))
        facts = store._artifact_facts(connection, _padded(artifacts))
        assert facts == store._artifact_facts(connection, artifacts) and len(facts[1]) == 40
        previous = store._previous_run(connection, _padded(ids))
        assert previous == store._previous_run(connection, ids) and previous[2] == f"req_{35:032x}"
        ending = store._runs_ending_at(connection, "acme", _padded(ids))
        assert ending == store._runs_ending_at(connection, "acme", ids) and len(ending) == 40
        results = store._results_of_runs(connection, "acme", _padded([f"req_{1000:032x}"]))
        assert list(results.values()) == ["bash"]


def test_a_path_is_read_back_whole_whatever_its_length(store: RecordStore) -> None:
    """`path_messages` walks the path from its leaf and joins its artifacts in one statement."""
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
    for n in range(600):
        messages += _round(n)
    path = message_path("acme", messages)
    store.ingest(path, _run(1))
    assert store.path_messages(path[-1].id) == [
        {**m, "artifact_id": artifact_id_for(node.id)} if m["role"] == "tool" else m
        for m, node in zip(messages, path)]


def test_calls_are_tied_to_the_runs_that_made_them_in_one_capture(tmp_path: Path) -> None:
    """The run that produced each new assistant message (the run whose request ended at its parent) is
    looked up for all of them at once; a message no run produced has none."""
    store = make_store(f"sqlite:///{tmp_path / 'g.db'}", tmp_path / "blobs")
    head = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
    store.ingest(message_path("acme", head), _run(1))
    store.ingest(message_path("acme", head + _round(0)), _run(2))
    store.ingest(message_path("acme", head + _round(0) + _round(1) + _round(2)), _run(3))
    calls = {call["call_id"]: call["run_id"] for call in store.iter_tool_calls("acme")}
    # c0 answered the request that ended at the user message; c1 the one that ended at c0's result;
    # c2 follows c1's result, where no request ended (the client sent two rounds at once)
    assert calls == {"c0": f"req_{1:032x}", "c1": f"req_{2:032x}", "c2": None}
    store.engine.dispose()


def test_the_previous_run_is_looked_for_near_the_end_first_and_found_anywhere(store: RecordStore) -> None:
    """`_previous_run` reads the path's last PREVIOUS_RUN_WINDOW leaves, and the whole path only when no
    finished run ended there: the same run the whole path's lookup finds, in either case."""
    from storage.path_reads import PREVIOUS_RUN_WINDOW

    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
    store.ingest(message_path("acme", messages), _run(0))
    store.finish_run(f"req_{0:032x}", RunOutcome(status="ok", latency_ms=1.0, tokens_original=7))
    for n in range(1, PREVIOUS_RUN_WINDOW):  # a long resumed transcript: no run ended since the first
        messages += _round(n)
    ids = [node.id for node in message_path("acme", messages)]
    assert len(ids) > PREVIOUS_RUN_WINDOW
    with store.engine.connect() as connection:
        far = store._previous_run(connection, ids)  # only the whole path has it
        assert far is not None and far[2] == f"req_{0:032x}" and far[1] == ids[1]
    store.ingest(message_path("acme", messages), _run(1))
    store.finish_run(f"req_{1:032x}", RunOutcome(status="ok", latency_ms=1.0, tokens_original=9))
    messages += _round(PREVIOUS_RUN_WINDOW)
    ids = [node.id for node in message_path("acme", messages)]
    with store.engine.connect() as connection:
        near = store._previous_run(connection, ids)
        assert near is not None and near[2] == f"req_{1:032x}" and near[1] == ids[-3]


class _Clock:
    def __init__(self, moment: float) -> None:
        self.moment = moment

    def __call__(self) -> float:
        return self.moment


def _facts(store: RecordStore, messages: list[dict], n: int, label: str = "task") -> IngestResult:
    run = RunStart(request_id=f"req_{n:032x}", tenant="acme", participant="p", model="fake",
                   upstream_model="openai/fake", stream=False, session_label=label)
    return store.ingest(message_path("acme", messages), run)


def _as_read_afresh(store: RecordStore, result: IngestResult) -> tuple[dict, dict, frozenset]:
    """What the database says of the result's path artifacts, with nothing held."""
    with store.engine.connect() as connection:
        return type(store)._artifact_facts(store, connection, list(result.path_artifact_ids))


def _reads(store: RecordStore) -> list[list[str]]:
    """The artifact ids each read of facts from the database asked about, from now on: those a request
    found missing from what the store holds (read after the capture on SQLite, in the capture's batch on
    PostgreSQL)."""
    asked: list[list[str]] = []
    missing = store._facts_missing

    def counting(*args):  # type: ignore[no-untyped-def]
        found = missing(*args)
        if found:
            asked.append(list(found))
        return found

    store._facts_missing = counting  # type: ignore[method-assign]
    return asked


def test_a_conversations_artifact_facts_are_read_once_and_stay_true(storage_url: str, tmp_path: Path) -> None:
    """A request reads the facts of the artifacts no earlier request of the conversation read; what it
    hands the assembler is what the database says, request after request, on every replica: a second
    store on the same database (another process) sees a rehydration mark made through the first, and
    a conversation deleted and captured again is observed anew, though both held its facts before."""
    clock = _Clock(1_000_000.0)
    first = RecordStore(make_engine(storage_url), DirectoryBlobStore(tmp_path / "blobs"), clock=clock)
    first.create_schema()
    second = RecordStore(make_engine(storage_url), DirectoryBlobStore(tmp_path / "blobs"), clock=clock)
    try:
        messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
        for n in range(12):
            messages += _round(n)
            result = _facts(first, messages, n)
            assert (result.observed_at, result.owners, result.rehydrated) == _as_read_afresh(first, result)
        asked = _reads(first)
        messages += _round(12)
        result = _facts(first, messages, 12)
        assert asked == [[artifact_id_for(message_path("acme", messages)[-1].id)]]  # the new round's only
        assert len(result.observed_at) == 13
        assert (result.observed_at, result.owners, result.rehydrated) == _as_read_afresh(first, result)
        _facts(first, messages, 13)  # the same path again: nothing to read
        assert len(asked) == 1

        held = _facts(second, messages, 14)  # the other replica holds the conversation's facts too
        marked = result.path_artifact_ids[4]
        first.mark_rehydrated("acme", marked)
        assert _facts(second, messages, 15).rehydrated == {marked}
        assert _facts(first, messages, 16).rehydrated == {marked}

        clock.moment += 3600
        assert first.delete_conversation("acme", "task")["tool_artifacts"] == 13
        again = _facts(first, messages, 17)  # captured anew: observed now, and nothing marked
        assert set(again.observed_at.values()) == {clock.moment} and not again.rehydrated
        seen_by_second = _facts(second, messages, 18)
        assert (seen_by_second.observed_at, seen_by_second.rehydrated) == (again.observed_at, frozenset())
        assert seen_by_second.observed_at != held.observed_at
    finally:
        first.engine.dispose()
        second.engine.dispose()


def test_retentions_claim_moves_the_incarnation_on(store: RecordStore) -> None:
    """Retention claims a conversation before it deletes its records: the claim moves the incarnation
    on, so facts held from before are not the ones a later capture is given."""
    messages = [{"role": "user", "content": "go"}, *_round(0)]
    _facts(store, messages, 0)
    conversation = conversation_id_for("acme", "task", message_path("acme", messages), "req_unused")
    table = Conversation.__table__
    with store.engine.connect() as connection:
        before = connection.scalar(select(table.c.incarnation).where(table.c.id == conversation))
    report = run_gc(store, lambda tenant: RetentionClasses(artifacts=timedelta(days=1)),
                    datetime.fromtimestamp(store.clock(), timezone.utc) + timedelta(days=2))
    assert report.counts.get("tool_artifacts") == 1
    with store.engine.connect() as connection:
        assert connection.scalar(select(table.c.incarnation).where(table.c.id == conversation)) == before + 1


def test_on_postgresql_the_path_state_is_the_three_reads_in_one(postgres_url: str, tmp_path: Path) -> None:
    """The capture's one PostgreSQL statement (`_path_state`) answers as the three reads it stands for:
    the conversation's artifacts (a branch off the path among them), its subagents' results (but the
    asking subagent's own), and the previous run, near the path's end or only far back."""
    store = make_store(postgres_url, tmp_path / "blobs")
    try:
        messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
        for n in range(45):
            messages += _round(n)
            store.ingest(message_path("acme", messages), _run(n))
            if n in (3, 44):
                store.finish_run(f"req_{n:032x}", RunOutcome(status="ok", latency_ms=1.0, tokens_original=n + 1))
        store.ingest(message_path("acme", [*messages[:20], *_round(500)]), _run(500))  # a branch: a sibling
        child = message_path("acme", [{"role": "user", "content": "subtask"}, *_round(99)])
        store.ingest(child, _run(1000, parent=f"req_{44:032x}"))
        path = message_path("acme", messages)
        conversation = conversation_id_for("acme", None, path, "req_unused")
        checked = []
        for nodes, parent in ((path, None), (path[:80], None), (path, f"req_{44:032x}")):
            run = _run(2000, parent=parent)
            leaves = [n.id for n in nodes]
            with store.engine.connect() as connection:
                one = store._path_state(connection, run, conversation, nodes)
                separate = (min(connection.scalar(_ALL_ARTIFACT_MEMBERS, {"conversation": conversation}),
                                SIBLING_COUNT_BOUND + len(leaves)),
                    store._subagent_results(connection, "acme", conversation, parent),
                    store._previous_run(connection, leaves))
            assert (one[0], one[1], tuple(one[2]) if one[2] else None) == (
                separate[0], separate[1], tuple(separate[2]) if separate[2] else None)
            checked.append(one)
        assert checked[0][0] == 46 and list(checked[0][1].values()) == ["bash"] and checked[0][2][2] == f"req_{44:032x}"
        assert checked[1][2][2] == f"req_{3:032x}"  # the window held no finished run: looked for far back
        assert checked[2][1] == {}  # the subagent asking is not its own subagent
    finally:
        store.engine.dispose()


def _rows_read_per_leaf(connection, statement, parameters: dict) -> list[int]:  # type: ignore[no-untyped-def]
    """PostgreSQL: the rows each probe of model_runs read, from the statement's analysed plan."""
    from sqlalchemy import text

    analysed = text("EXPLAIN (ANALYZE, FORMAT JSON) " + statement.text).bindparams(*statement._bindparams.values())
    plan = connection.execute(analysed, parameters).scalar()[0]["Plan"]
    found: list[int] = []

    def walk(node: dict) -> None:
        if node.get("Relation Name") == "model_runs":
            found.append(node["Actual Rows"] + node.get("Rows Removed by Filter", 0))
        for child in node.get("Plans", []):
            walk(child)

    walk(plan)
    return found


def test_a_leaf_many_runs_ended_at_costs_one_probe(store: RecordStore) -> None:
    """A prefix sent again and again (retries, an agent branching from one point, a benchmark) ends many
    runs at one leaf. The previous run (the latest finished one) and each leaf's latest run are still
    what every run says, and each is read from the end of ix_model_runs_leaf_started: SQLite searches
    that index for the leaf and sorts nothing; PostgreSQL reads a row or two for it, not every run."""
    from sqlalchemy import text

    from storage.path_reads import _POSTGRESQL, _SQLITE

    clock = _Clock(2_000_000.0)
    store.clock = clock
    head = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}, *_round(0)]
    for n in range(40):
        clock.moment += 1
        store.ingest(message_path("acme", head), _run(n))
        if n < 37 and n % 3:  # finished; every third and the last three still pending
            store.finish_run(f"req_{n:032x}", RunOutcome(status="ok", latency_ms=1.0, tokens_original=n))
    leaves = [node.id for node in message_path("acme", head)]
    with store.engine.connect() as connection:
        previous = store._previous_run(connection, leaves)
        assert previous is not None and previous[2] == f"req_{35:032x}" and previous[0] == 35
        assert store._runs_ending_at(connection, "acme", [leaves[-1], leaves[0]]) == {leaves[-1]: f"req_{39:032x}"}
        assert store._runs_ending_at(connection, "other", leaves) == {}
        if connection.dialect.name == "sqlite":
            for statement, sorts in ((_SQLITE.previous_run, 1), (_SQLITE.runs_ending_at, 0)):
                plan = [row[3] for row in connection.execute(text("EXPLAIN QUERY PLAN " + statement.text),
                                                             {"leaves": "[]", "tenant": "acme"})]
                assert "SEARCH model_runs USING INDEX ix_model_runs_leaf_started (leaf_node_id=?)" in plan, plan
                # previous_run sorts the leaves' latest runs (one per leaf) to take the latest; nothing sorts runs
                assert sum("TEMP B-TREE" in step for step in plan) == sorts, plan
        else:  # a 40-row table is cheaper to scan whole; a real one is not, and the index is what is shown here
            connection.execute(text("SET LOCAL enable_seqscan = off"))
            parameters = {"leaves": [leaves[-1]], "tenant": "acme"}
            # runs 39, 38, 37 and 36 are pending (passed over from the index's end), 35 is the answer
            assert _rows_read_per_leaf(connection, _POSTGRESQL.previous_run, parameters) == [5]
            assert _rows_read_per_leaf(connection, _POSTGRESQL.runs_ending_at, parameters) == [1]
