"""A capture builds the rows of the nodes likely new before its transaction (storage/capture_rows.py
`_prepare`); what it stores is what it stores when it builds every row in the transaction, whether
the guess was right, short (a path new to this process, a deletion since) or wrong (nodes stored by
another process)."""
from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from policies.transcript import message_path
from storage.capture_rows import PREPARED_MOST
from storage.record_types import RunStart
from storage.records import RecordStore
from storage.schema import Base, ConversationNode, MessageNode, ModelRun, ToolArtifact, ToolCall
from testkit.gateway import make_store

MOMENT = datetime(2027, 1, 15, 8, 0, tzinfo=timezone.utc)
TABLES = (MessageNode, ToolArtifact, ToolCall, ConversationNode, ModelRun)


def _round(n: int, branch: int, size: int = 1) -> list[dict[str, Any]]:
    call = f"call_{branch}_{n}"
    return [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call, "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {n}}}'}}]},
            {"role": "tool", "tool_call_id": call, "content": f"output {n} of branch {branch} " * size}]


def _unprepared(store: RecordStore) -> RecordStore:
    """`store` building every row in the capture's transaction, as before `_prepare`."""
    prepare = store._prepare
    store._prepare = lambda path, run: prepare(path, run)._replace(rows={})  # type: ignore[method-assign]
    return store


def _dump(store: RecordStore) -> dict[str, list[tuple[Any, ...]]]:
    with store.engine.connect() as connection:
        return {model.__tablename__: sorted(tuple(row) for row in connection.execute(select(model.__table__)))
                for model in TABLES}


@pytest.mark.parametrize("seed", [3, 17])
def test_prepared_rows_store_what_rows_built_under_the_lock_store(storage_url: str, tmp_path: Path,
                                                                  seed: int) -> None:
    rng = random.Random(seed)
    head = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix it"}]
    transcripts = [head]
    steps: list[tuple[Any, ...]] = []
    for step in range(40):
        if step % 11 == 10:  # a deletion: the leaves the prepared store holds are stale now
            steps.append(("delete", rng.choice(["one", "two"])))
            continue
        base = rng.choice(transcripts)
        cut = base[:rng.randrange(2, len(base) + 1)]
        cut = cut[:len(cut) - (len(cut) % 2)] if len(cut) > 2 else cut
        grown = cut + [m for n in range(rng.choice([0, 1, 1, 2, PREPARED_MOST])) for m in
                       _round(len(cut) + n, step, rng.choice([1, 200]))]
        transcripts.append(grown)
        steps.append(("capture", grown, rng.choice(["one", "two", None])))
    dumps = []
    for unprepared in (False, True):  # one after the other, on the same database
        store = make_store(storage_url, tmp_path / f"blobs-{unprepared}")
        store = _unprepared(store) if unprepared else store
        store.clock = MOMENT.timestamp
        for number, step in enumerate(steps):
            if step[0] == "delete":
                store.delete_conversation("acme", step[1])
                continue
            store.ingest(message_path("acme", step[1]), RunStart(
                request_id=f"req_{number:032x}", tenant="acme", participant="p", model="fake",
                upstream_model="openai/fake", stream=False, session_label=step[2], started_at=MOMENT))
        dumps.append(_dump(store))
        with store.engine.begin() as connection:  # emptied for the other store
            for table in reversed(Base.metadata.sorted_tables):
                connection.execute(table.delete())
        store.engine.dispose()
    prepared, plain = dumps
    assert prepared == plain and len(prepared["tool_artifacts"]) > PREPARED_MOST


def test_rows_prepared_for_nodes_stored_meanwhile_are_not_stored_twice(store: RecordStore) -> None:
    """Another process captured the path after this one guessed its nodes new: nothing is stored
    twice, and the capture says nothing of it is new."""
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}, *_round(1, 1)]
    path = message_path("acme", messages)
    run = RunStart(request_id=f"req_{1:032x}", tenant="acme", participant="p", model="fake",
                   upstream_model="openai/fake", stream=False, session_label="s")
    prepared = store._prepare(path, run)
    assert set(prepared.rows) == {n.id for n in path}  # all new to this process
    store.ingest(path, run)  # "another process": the path is stored before this capture's transaction
    written = store._in_transaction(lambda connection: store._ingest(
        connection, path, replace(run, request_id=f"req_{2:032x}"), prepared))
    assert written.new_node_ids == () and written.new_artifact_ids == ()
    with store.engine.connect() as connection:
        assert len(list(connection.execute(select(MessageNode.id)))) == len(path)
