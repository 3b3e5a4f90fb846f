"""What a capture asks the database about a path's nodes: only the tail and what is new, yet the same
answer as looking up every node (issue 11), across branches, resends, shared prefixes and deletions."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Iterator

import pytest

from policies.transcript import message_path
from storage.capture import conversation_id_for
from storage.record_types import RunStart
from storage.records import RecordStore
from tests.conftest import make_store


@pytest.fixture
def store(storage_url: str, tmp_path: Path) -> Iterator[RecordStore]:
    store = make_store(storage_url, tmp_path / "blobs")
    yield store
    store.engine.dispose()


def _round(n: int, branch: int) -> list[dict]:
    call = f"call_{branch}_{n}"
    return [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call, "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {n}}}'}}]},
            {"role": "tool", "tool_call_id": call, "content": f"output {n} of branch {branch}"}]


def test_the_probed_answer_is_the_looked_up_one(store: RecordStore) -> None:
    rng = random.Random(11)
    head = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix it"}]
    transcripts = [head]
    labels = ["one", "two", None]
    for step in range(60):
        if step % 13 == 12:  # a deletion: the conversation's memberships go whole, shared nodes stay
            store.delete_conversation("acme", rng.choice(labels[:2]))
            continue
        base = rng.choice(transcripts)
        cut = base[:rng.randrange(2, len(base) + 1)]
        cut = cut[:len(cut) - (len(cut) % 2)] if len(cut) > 2 else cut  # end on an answered round
        grown = cut + [m for n in range(rng.choice([0, 1, 1, 2, 40])) for m in _round(len(cut) + n, step)]
        transcripts.append(grown)
        label = rng.choice(labels)
        path = message_path("acme", grown)
        conversation = conversation_id_for("acme", label, path)
        ids = [n.id for n in path]
        with store.engine.connect() as connection:
            assert store._known_nodes(connection, conversation, ids) == store._node_states(connection, conversation, ids)
        result = store.ingest(path, RunStart(request_id=f"req_{step:032x}", tenant="acme", participant="p",
                                             model="fake", upstream_model="openai/fake", stream=False,
                                             session_label=label))
        with store.engine.connect() as connection:
            existing, members = store._node_states(connection, conversation, ids)
        assert existing == members == set(ids)
        assert len(result.new_node_ids) <= len(ids)
    assert max(len(t) for t in transcripts) > 2 * 32 + 10  # paths longer than the probed tail
