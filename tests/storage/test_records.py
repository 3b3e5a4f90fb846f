"""The record store on SQLite and on PostgreSQL: capture, dedup, branches, blobs."""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from policies.transcript import artifact_id_for, message_path
from storage.records import RecordStore
from storage.record_types import RunOutcome, RunStart
from testkit.gateway import make_store

TOOL_ROUND = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Read the config."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.yaml"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "bash", "arguments": '{"command": "false"}'}},
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": "key: value\nother: ünïcödé ✓\n"},
    {"role": "tool", "tool_call_id": "call_2", "content": "Error: command exited with status 1"},
]


@pytest.fixture
def store(storage_url: str, tmp_path: Path) -> RecordStore:
    store = make_store(storage_url, tmp_path / "blobs", inline_max_bytes=1024)
    yield store
    store.engine.dispose()


def _run(request_id: str, tenant: str = "acme") -> RunStart:
    return RunStart(request_id=request_id, tenant=tenant, participant="key-1", model="fake",
                    upstream_model="openai/fake", stream=False)


def test_tool_results_become_byte_exact_artifacts(store: RecordStore) -> None:
    path = message_path("acme", TOOL_ROUND)
    result = store.ingest(path, _run("req_1"))
    assert len(result.new_artifact_ids) == 2
    first = store.get_artifact(artifact_id_for(path[3].id), "acme")
    assert first is not None
    assert store.artifact_bytes(first) == TOOL_ROUND[3]["content"].encode()
    assert first.sha256 == hashlib.sha256(TOOL_ROUND[3]["content"].encode()).hexdigest()
    assert first.bytes == len(TOOL_ROUND[3]["content"].encode())
    assert (first.tool_name, first.arguments, first.status) == ("read_file", '{"path": "a.yaml"}', "ok")
    assert first.tokens > 0 and first.captured_by_request == "req_1"
    failed = store.get_artifact(artifact_id_for(path[4].id), "acme")
    assert failed is not None and failed.status == "error" and failed.tool_name == "bash"


def test_resent_transcript_adds_no_rows(store: RecordStore) -> None:
    path = message_path("acme", TOOL_ROUND)
    store.ingest(path, _run("req_1"))
    again = store.ingest(path, _run("req_2"))
    assert again.new_node_ids == () and again.new_artifact_ids == ()
    assert store.count_artifacts("acme") == 2
    longer = TOOL_ROUND + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "thanks"}]
    grown = store.ingest(message_path("acme", longer), _run("req_3"))
    assert len(grown.new_node_ids) == 2 and grown.new_artifact_ids == ()
    record = store.get_run("req_3", "acme")
    assert record is not None and record.path_artifact_ids == again.path_artifact_ids
    assert record.captured_artifacts == ()


def test_branches_share_their_common_prefix(store: RecordStore) -> None:
    store.ingest(message_path("acme", TOOL_ROUND), _run("req_1"))
    edited = TOOL_ROUND[:1] + [{"role": "user", "content": "Read the OTHER config."}] + TOOL_ROUND[2:]
    branch = store.ingest(message_path("acme", edited), _run("req_2"))
    # The system message is shared; everything from the edited user message on is new.
    assert len(branch.new_node_ids) == len(edited) - 1
    assert len(branch.new_artifact_ids) == 2
    assert store.count_artifacts("acme") == 4
    same_root = message_path("acme", TOOL_ROUND)[0].id
    assert message_path("acme", edited)[0].id == same_root


def test_tenants_are_isolated(store: RecordStore) -> None:
    path = message_path("acme", TOOL_ROUND)
    store.ingest(path, _run("req_1"))
    other = store.ingest(message_path("globex", TOOL_ROUND), _run("req_2", tenant="globex"))
    assert len(other.new_artifact_ids) == 2  # same content, different tenant: its own records
    art = artifact_id_for(path[3].id)
    assert store.get_artifact(art, "globex") is None
    assert store.get_artifact(art, None) is not None  # admin scope
    assert store.get_run("req_1", "globex") is None


def test_large_artifacts_go_to_the_blob_store(store: RecordStore, tmp_path: Path) -> None:
    big = "line of build output\n" * 500  # over the 1 KiB inline bound of this store
    messages = TOOL_ROUND[:3] + [{"role": "tool", "tool_call_id": "call_1", "content": big},
                                 TOOL_ROUND[4]]
    path = message_path("acme", messages)
    store.ingest(path, _run("req_1"))
    record = store.get_artifact(artifact_id_for(path[3].id), "acme")
    assert record is not None and record.blob_key == hashlib.sha256(big.encode()).hexdigest()
    assert (tmp_path / "blobs" / record.blob_key[:2] / record.blob_key).read_bytes() == big.encode()
    assert store.artifact_bytes(record) == big.encode()


def test_structured_tool_content_is_kept(store: RecordStore) -> None:
    parts = [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]
    messages = TOOL_ROUND[:3] + [{"role": "tool", "tool_call_id": "call_1", "content": parts}, TOOL_ROUND[4]]
    path = message_path("acme", messages)
    store.ingest(path, _run("req_1"))
    record = store.get_artifact(artifact_id_for(path[3].id), "acme")
    assert record is not None and record.content_type == "application/json"
    assert store.artifact_bytes(record) == b'[{"text":"part one","type":"text"},{"text":"part two","type":"text"}]'


def test_run_outcome_and_tool_call_provenance(store: RecordStore) -> None:
    first = TOOL_ROUND[:2]
    store.ingest(message_path("acme", first), _run("req_1"))
    store.finish_run("req_1", RunOutcome(status="ok", latency_ms=12.5, http_status=200, prompt_tokens=30,
                                         completion_tokens=9, cached_tokens=4, total_tokens=39,
                                         finish_reason="tool_calls", response={"id": "x"}))
    store.ingest(message_path("acme", TOOL_ROUND), _run("req_2"))
    run = store.get_run("req_1", "acme").run
    assert run["status"] == "ok" and run["usage"] == {"prompt_tokens": 30, "completion_tokens": 9,
                                                      "cached_tokens": 4, "cache_write_tokens": None,
                                                      "total_tokens": 39}
    calls = {c["call_id"]: c for c in store.iter_tool_calls("acme")}
    # The assistant message with the calls answered req_1, whose request ended at its parent.
    assert calls["call_1"]["run_id"] == "req_1" and calls["call_2"]["name"] == "bash"


def test_concurrent_ingest_of_one_transcript_stores_it_once(store: RecordStore) -> None:
    path = message_path("acme", TOOL_ROUND)
    errors: list[BaseException] = []

    def send(i: int) -> None:
        try:
            store.ingest(path, _run(f"req_{i}"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.count_artifacts("acme") == 2


def test_a_value_the_database_refuses_is_unstorable_not_a_crash(postgres_url: str, tmp_path: Path) -> None:
    """Input checks keep such values out; should one pass them, capture says so and stores nothing.
    (PostgreSQL enforces column lengths; SQLite does not.)"""
    from storage.record_types import UnstorableValue

    store = make_store(postgres_url, tmp_path / "blobs")
    messages = [{"role": "user", "content": "x"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "n" * 300, "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    try:
        with pytest.raises(UnstorableValue):
            store.ingest(message_path("acme", messages), _run("req_long"))
        assert store.count_artifacts() == 0
    finally:
        store.engine.dispose()


def test_short_references_resolve_within_the_tenant_and_only_when_unique(store: RecordStore) -> None:
    """A memory names an artifact by a short reference (policies.transcript.short_ref); the store resolves it
    for its tenant when it names one artifact, and never across tenants; call arguments likewise."""
    from policies.transcript import arguments_artifact_id, short_ref

    path = message_path("acme", TOOL_ROUND)
    store.ingest(path, _run("req_1"))
    full = artifact_id_for(path[3].id)
    short = short_ref(full)
    assert len(short) == len("art_") + 10 and full.startswith(short)
    found = store.get_artifact(short, "acme")
    assert found is not None and found.id == full
    assert store.get_artifact(short, "globex") is None
    assert store.get_artifact(short[:-1], "acme") is None  # shorter than a reference: no prefix search
    assert store.get_artifact(short + "z", "acme") is None
    arguments = arguments_artifact_id(path[2].id, "call_1")
    by_short = store.get_call_arguments(short_ref(arguments), "acme")
    assert by_short is not None and by_short[0] == '{"path": "a.yaml"}' and by_short[1]["id"] == arguments
    assert store.get_call_arguments(short_ref(arguments), "globex") is None
    # The same transcript of another tenant: its own ids, so its own references; an admin's read of a
    # reference finds the one artifact it names.
    store.ingest(message_path("globex", TOOL_ROUND), _run("req_2", tenant="globex"))
    other = short_ref(artifact_id_for(message_path("globex", TOOL_ROUND)[3].id))
    assert other != short and store.get_artifact(other, "acme") is None
    assert store.get_artifact(short, None).id == full


def test_a_result_a_model_had_back_is_read_with_the_paths_facts(store: RecordStore) -> None:
    """`mark_rehydrated` notes it once, for its tenant only; the next ingest of the path says so."""
    path = message_path("acme", TOOL_ROUND)
    first = store.ingest(path, _run("req_1"))
    assert first.rehydrated == frozenset()
    read, failed = artifact_id_for(path[3].id), artifact_id_for(path[4].id)
    store.mark_rehydrated("globex", read)  # another tenant's note reaches nothing of acme's
    assert store.ingest(path, _run("req_2")).rehydrated == frozenset()
    store.mark_rehydrated("acme", read)
    store.mark_rehydrated("acme", read)  # again: the first moment stays
    again = store.ingest(path, _run("req_3"))
    assert again.rehydrated == {read} and failed not in again.rehydrated
    assert again.observed_at[read] == first.observed_at[read]
