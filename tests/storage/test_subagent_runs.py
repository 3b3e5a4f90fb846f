"""A conversation's subagent runs are found through the children's `parent_conversation_id` (revision
0011): the same runs the join over every run of the conversation found, as parents and children come and
go, and the migration fills the column in for children stored before it."""
from __future__ import annotations

import random
from pathlib import Path

from sqlalchemy import bindparam, select, text

from policies.transcript import label_conversation_id, message_path
from storage.record_types import RunStart
from storage.records import RecordStore
from storage.schema import ModelRun

_CHILD, _PARENT = ModelRun.__table__.alias("child_run"), ModelRun.__table__.alias("parent_run")
# The lookup as it was before 0011: every run of the conversation, and the children of each.
_BY_EVERY_RUN = (
    select(_CHILD.c.id).join(_PARENT, _CHILD.c.parent_request_id == _PARENT.c.id)
    .where(_PARENT.c.conversation_id == bindparam("conversation"), _PARENT.c.tenant == bindparam("tenant"),
           _CHILD.c.tenant == bindparam("tenant"))
)


def _transcript(label: str, n: int) -> list[dict]:
    call = f"call_{label}_{n}"
    return [{"role": "system", "content": "agent"}, {"role": "user", "content": f"task {label}"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call, "type": "function", "function": {"name": "grep", "arguments": f'{{"n": {n}}}'}}]},
            {"role": "tool", "tool_call_id": call, "content": f"result {label} {n}"}]


def _run(store: RecordStore, number: int, label: str, session: str | None, parent: str | None) -> str:
    request_id = f"req_{number:032x}"
    store.ingest(message_path("acme", _transcript(label, number)), RunStart(
        request_id=request_id, tenant="acme", participant="p", model="fake", upstream_model="openai/fake",
        stream=False, session_label=session, parent_request_id=parent))
    return request_id


def test_the_children_found_are_those_the_join_over_every_run_found(store: RecordStore) -> None:
    rng = random.Random(5)
    sessions = ["main-a", "main-b"]
    parents: dict[str, list[str]] = {session: [] for session in sessions}
    number = 0
    for step in range(40):
        number += 1
        session = rng.choice(sessions)
        if step % 3 == 0 or not any(parents.values()):
            parents[session].append(_run(store, number, session, session, None))
        elif step % 11 == 10:
            gone = rng.choice(sessions)
            store.delete_conversation("acme", gone)  # its parents go; their children stay
            parents[gone] = []
        else:
            parent = rng.choice([r for runs in parents.values() for r in runs])
            _run(store, number, f"child-{number}", None, parent)
        for conversation in (label_conversation_id("acme", s) for s in sessions):
            with store.engine.connect() as connection:
                old = set(connection.scalars(_BY_EVERY_RUN, {"conversation": conversation, "tenant": "acme"}))
                new = set(connection.scalars(
                    select(ModelRun.id).where(ModelRun.parent_conversation_id == conversation,
                                              ModelRun.id.in_(old or [""]))))
                assert old == new  # every child the old lookup finds carries its parent's conversation
                results = store._subagent_results(connection, "acme", conversation, None)
                expected = dict(connection.execute(text(
                    "SELECT COALESCE(original_sha256, sha256), COALESCE(tool_name, '') FROM tool_artifacts "
                    "WHERE captured_by_request IN ({})".format(",".join(f"'{r}'" for r in old) or "''"))).all())
            assert results == expected
    with store.engine.connect() as connection:  # the walk did leave children to find
        assert any(store._subagent_results(connection, "acme", label_conversation_id("acme", s), None)
                   for s in sessions)


def test_0011_fills_in_the_parent_conversation_of_children_stored_before_it(store: RecordStore) -> None:
    from alembic import command
    from alembic.config import Config as AlembicConfig

    parent = _run(store, 1, "main", "main", None)
    child = _run(store, 2, "child", None, parent)
    config = AlembicConfig()
    config.set_main_option("script_location", str(Path(__file__).resolve().parents[2] / "storage" / "migrations"))
    with store.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0010")
    store.create_schema()  # back to head: 0011 fills the column in
    with store.engine.connect() as connection:
        filled = dict(connection.execute(text("SELECT id, parent_conversation_id FROM model_runs")).all())
        assert store._subagent_results(connection, "acme", label_conversation_id("acme", "main"), None)
    assert filled == {parent: None, child: label_conversation_id("acme", "main")}
