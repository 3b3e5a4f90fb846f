"""What a capture asks the database about a path's nodes: only the tail and what is new, yet the same
answer as looking up every node (issue 11), across branches, resends, shared prefixes and deletions."""
from __future__ import annotations

import random
from pathlib import Path

from sqlalchemy import Connection, select

from policies.transcript import conversation_id_for, message_path
from storage.record_types import RunOutcome, RunStart, as_utc
from storage.records import RecordStore
from storage.schema import ConversationNode, MessageNode, ModelRun, ToolArtifact
from testkit.gateway import make_store


def _round(n: int, branch: int) -> list[dict]:
    call = f"call_{branch}_{n}"
    return [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call, "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {n}}}'}}]},
            {"role": "tool", "tool_call_id": call, "content": f"output {n} of branch {branch}"}]


def _plainly(connection: Connection, conversation: str, ids: list[str]) -> tuple[set[str], set[str]]:
    """(the nodes of `ids` that exist, those the conversation uses), by two plain queries."""
    existing = set(connection.scalars(select(MessageNode.id).where(MessageNode.id.in_(ids))))
    members = set(connection.scalars(select(ConversationNode.node_id).where(
        ConversationNode.conversation_id == conversation, ConversationNode.node_id.in_(ids))))
    return existing, members


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
        conversation = conversation_id_for("acme", label, path, f"req_{step:032x}")
        ids = [n.id for n in path]
        with store.engine.connect() as connection:
            looked_up = store._node_states(connection, conversation, ids)
            assert looked_up == _plainly(connection, conversation, ids)
            assert store._known_nodes(connection, conversation, ids) == looked_up
        result = store.ingest(path, RunStart(request_id=f"req_{step:032x}", tenant="acme", participant="p",
                                             model="fake", upstream_model="openai/fake", stream=False,
                                             session_label=label))
        with store.engine.connect() as connection:
            existing, members = store._node_states(connection, conversation, ids)
        assert existing == members == set(ids)
        assert len(result.new_node_ids) <= len(ids)
    assert max(len(t) for t in transcripts) > 2 * 32 + 10  # paths longer than the probed tail


def test_sqlites_json_reads_answer_as_the_generic_ones(tmp_path: Path) -> None:
    """On SQLite the artifact facts and the previous run are read with the ids as one JSON array
    (storage/path_reads.py); the answer is that of plain `IN` lists."""
    store = make_store(f"sqlite:///{tmp_path / 'g.db'}", tmp_path / "blobs")
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
    for n in range(30):
        messages = messages + _round(n, 0)
        run = RunStart(request_id=f"req_{n:032x}", tenant="acme", participant=f"p{n % 3}", model="fake",
                       upstream_model="openai/fake", stream=False)
        store.ingest(message_path("acme", messages), run)
        if n % 4 == 0:
            store.finish_run(run.request_id, RunOutcome(status="ok", latency_ms=1.0, tokens_original=n + 1))
    path = message_path("acme", messages)
    artifacts = [f"art_{node.id[:20]}" for node in path if node.message["role"] == "tool"] + ["art_missing"]
    leaves = [node.id for node in path]
    runs, nodes = ModelRun.__table__, ToolArtifact.__table__
    store.mark_rehydrated("acme", artifacts[3])
    store.mark_rehydrated("globex", artifacts[4])  # another tenant's mark reaches nothing of acme's
    with store.engine.connect() as connection:
        fast = store._artifact_facts(connection, artifacts)
        assert fast[2] == {artifacts[3]}
        generic: tuple[dict, dict, set] = ({}, {}, set())
        for artifact_id, moment, owner, back in connection.execute(
                select(nodes.c.id, nodes.c.observed_at, nodes.c.owner_participant, nodes.c.rehydrated_at)
                .where(nodes.c.id.in_(artifacts))):
            generic[0][artifact_id] = as_utc(moment).timestamp()
            generic[1][artifact_id] = owner
            if back is not None:
                generic[2].add(artifact_id)
        assert fast == (generic[0], generic[1], frozenset(generic[2])) and len(fast[0]) == 30
        assert set(fast[1].values()) == {"p0", "p1", "p2"}
        previous = connection.execute(
            select(runs.c.tokens_original, runs.c.leaf_node_id, runs.c.id, runs.c.conversation_id)
            .where(runs.c.leaf_node_id.in_(leaves), runs.c.tokens_original.is_not(None))
            .order_by(runs.c.started_at.desc()).limit(1)).first()
        assert store._previous_run(connection, leaves) == previous is not None
    store.engine.dispose()
