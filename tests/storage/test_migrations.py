"""The Alembic migrations build exactly the schema the models describe, on SQLite and PostgreSQL."""
from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select

from storage.schema import Base
from testkit.gateway import make_store


def test_migrations_match_the_models(storage_url: str, tmp_path: Path) -> None:
    store = make_store(storage_url, tmp_path / "blobs")
    try:
        with store.engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
            tables = set(inspect(connection).get_table_names())
        assert diff == []
        assert {"message_nodes", "model_runs", "tool_calls", "tool_artifacts", "context_assemblies",
                "alembic_version"} <= tables
        store.create_schema()  # a second start is a no-op
    finally:
        store.engine.dispose()


def test_0004_carries_existing_conversations_over(storage_url: str, tmp_path: Path) -> None:
    """Data written before conversations were stored (revision 0003) is migrated so that deleting one
    conversation leaves its neighbours whole."""
    from alembic import command
    from alembic.config import Config as AlembicConfig
    from sqlalchemy import text

    from policies.transcript import message_path
    from storage.record_types import RunStart

    store = make_store(storage_url, tmp_path / "blobs", inline_max_bytes=100)
    system = {"role": "system", "content": "shared system prompt"}

    def conversation(opening: str) -> list[dict]:
        return [system, {"role": "user", "content": opening},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "build", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": f"{opening} output\n" * 20}]

    for request_id, opening, label in (("req_a", "A", "ticket-1"), ("req_b", "B", None)):
        path = message_path("acme", conversation(opening))
        store.ingest(path, RunStart(request_id=request_id, tenant="acme", participant="p", model="fake",
                                    upstream_model="openai/fake", stream=False, session_label=label))
    config = AlembicConfig()
    config.set_main_option("script_location", str(Path(__file__).resolve().parents[2] / "storage" / "migrations"))
    with store.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0003")
        # As 0003 left them: the first node after the system prompt, even for a labelled run.
        first_a = message_path("acme", conversation("A"))[1].id
        connection.execute(text("UPDATE model_runs SET conversation_id = :c WHERE id = 'req_a'"), {"c": first_a})
        connection.execute(text("UPDATE model_runs SET conversation_id = NULL WHERE id = 'req_b'"))
    store.create_schema()  # back to head: 0004 backfills
    try:
        with store.engine.connect() as connection:
            members = connection.execute(text("SELECT conversation_id, count(*) FROM conversation_nodes "
                                              "GROUP BY conversation_id")).all()
            conversations = dict(connection.execute(text("SELECT id, conversation_id FROM model_runs")).all())
            blobs = connection.execute(text("SELECT count(*) FROM blobs")).scalar()
        assert sorted(count for _, count in members) == [4, 4]
        assert conversations["req_a"].startswith("conv_")
        assert conversations["req_b"] == message_path("acme", conversation("B"))[1].id
        assert blobs == 2
        deleted = store.delete_conversation("acme", "ticket-1")
        assert deleted["model_runs"] == 1 and deleted["message_nodes"] == 3 and deleted["blobs"] == 1
        assert store.get_run("req_b", "acme") is not None and store.count_artifacts("acme") == 1
    finally:
        store.engine.dispose()


def test_0009_gives_existing_conversations_their_last_activity(storage_url: str, tmp_path: Path) -> None:
    """Conversations recorded before retention (revision 0005) are known to it after 0009, idle since
    their latest run, so garbage collection counts from the right moment."""
    from datetime import datetime, timedelta, timezone

    from alembic import command
    from alembic.config import Config as AlembicConfig
    from sqlalchemy import text

    from policies.transcript import message_path
    from storage.record_types import RunStart
    from storage.retention import RetentionClasses, run_gc

    store = make_store(storage_url, tmp_path / "blobs")
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    for request_id, label, days in (("req_1", "t-1", 0), ("req_2", "t-1", 10), ("req_3", "t-2", 1)):
        messages = [{"role": "user", "content": f"{label} {days}"}]
        store.ingest(message_path("acme", messages), RunStart(
            request_id=request_id, tenant="acme", participant="p", model="fake", upstream_model="openai/fake",
            stream=False, session_label=label, started_at=start + timedelta(days=days)))
    config = AlembicConfig()
    config.set_main_option("script_location", str(Path(__file__).resolve().parents[2] / "storage" / "migrations"))
    with store.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0005")
    store.create_schema()  # back to head: 0009 backfills
    try:
        with store.engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM conversations")).scalar() == 2
        classes = RetentionClasses(runs=timedelta(days=5))
        report = run_gc(store, lambda tenant: classes, start + timedelta(days=7))
        assert report.counts["model_runs"] == 1  # t-2's; t-1 was active on day 10
        assert store.get_run("req_1", "acme") is not None and store.get_run("req_3", "acme") is None
    finally:
        store.engine.dispose()


def test_0012_adds_dashboard_sessions_and_takes_them_away(storage_url: str, tmp_path: Path) -> None:
    """Before 0012 there is no session table (a cookie alone signed in); 0012 adds it, empty, so every
    cookie issued before signs in again; downgrading drops it and upgrading again brings it back."""
    from datetime import datetime, timedelta, timezone

    from alembic import command
    from alembic.config import Config as AlembicConfig

    store = make_store(storage_url, tmp_path / "blobs")
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    store.start_dashboard_session("sid", "key-0123456789ab", "acme", later)
    config = AlembicConfig()
    config.set_main_option("script_location", str(Path(__file__).resolve().parents[2] / "storage" / "migrations"))
    try:
        with store.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0011")
        with store.engine.connect() as connection:
            assert "dashboard_sessions" not in inspect(connection).get_table_names()
        store.create_schema()
        with store.engine.connect() as connection:
            indexes = {i["name"] for i in inspect(connection).get_indexes("dashboard_sessions")}
        assert {"ix_dashboard_sessions_key_id", "ix_dashboard_sessions_expires_at"} <= indexes
        assert store.dashboard_session("sid") is None  # what was there before is gone: sign in again
        store.start_dashboard_session("sid", "key-0123456789ab", "acme", later)
        assert store.dashboard_session("sid") is not None
    finally:
        store.engine.dispose()


def test_0020_indexes_runs_by_leaf_and_start_and_back(storage_url: str, tmp_path: Path) -> None:
    """0020 replaces the index on model_runs.leaf_node_id with one on (leaf_node_id, started_at); the
    runs stay, and the previous run is the same through either index."""
    from alembic import command
    from alembic.config import Config as AlembicConfig

    from policies.transcript import message_path
    from storage.record_types import RunOutcome, RunStart

    store = make_store(storage_url, tmp_path / "blobs")
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
    for n in range(3):
        store.ingest(message_path("acme", messages), RunStart(
            request_id=f"req_{n}", tenant="acme", participant="p", model="fake", upstream_model="openai/fake",
            stream=False))
        store.finish_run(f"req_{n}", RunOutcome(status="ok", latency_ms=1.0, tokens_original=10 + n))
    leaves = [node.id for node in message_path("acme", messages)]
    config = AlembicConfig()
    config.set_main_option("script_location", str(Path(__file__).resolve().parents[2] / "storage" / "migrations"))

    def indexes() -> set[str]:
        with store.engine.connect() as connection:
            return {i["name"] for i in inspect(connection).get_indexes("model_runs")}

    def previous() -> tuple:
        with store.engine.connect() as connection:
            return tuple(store._previous_run(connection, leaves))

    try:
        assert "ix_model_runs_leaf_started" in indexes() and "ix_model_runs_leaf_node_id" not in indexes()
        latest = previous()
        assert latest[2] == "req_2" and latest[0] == 12
        with store.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0019")
        assert "ix_model_runs_leaf_node_id" in indexes() and "ix_model_runs_leaf_started" not in indexes()
        assert previous() == latest
        store.create_schema()
        assert "ix_model_runs_leaf_started" in indexes() and "ix_model_runs_leaf_node_id" not in indexes()
        assert previous() == latest and store.get_run("req_0", "acme") is not None
    finally:
        store.engine.dispose()


def test_0021_adds_the_member_deltas_and_takes_them_away(storage_url: str, tmp_path: Path) -> None:
    """0021 adds conversation_member_deltas (PostgreSQL's captures under a share lock write there); down
    and up again, captures go on and the count is the join's."""
    from alembic import command
    from alembic.config import Config as AlembicConfig

    from policies.transcript import message_path
    from storage.artifact_members import _ALL_ARTIFACT_MEMBERS
    from storage.record_types import RunStart

    store = make_store(storage_url, tmp_path / "blobs")
    config = AlembicConfig()
    config.set_main_option("script_location", str(Path(__file__).resolve().parents[2] / "storage" / "migrations"))
    opening = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]

    def capture(n: int) -> str:
        rounds = [m for k in range(n) for m in (
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{k}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": f"out {k}"})]
        return store.ingest(message_path("acme", opening + rounds), RunStart(
            request_id=f"req_{n}", tenant="acme", participant="p", model="fake", upstream_model="openai/fake",
            stream=False, session_label="task")).conversation_id

    def tables() -> set[str]:
        with store.engine.connect() as connection:
            return set(inspect(connection).get_table_names())

    try:
        capture(1)
        conversation = capture(2)
        assert "conversation_member_deltas" in tables()
        with store.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0020")
        assert "conversation_member_deltas" not in tables()
        store.create_schema()
        assert "conversation_member_deltas" in tables()
        with store.engine.begin() as connection:  # what the rows held is counted again
            connection.execute(Base.metadata.tables["conversations"].update().values(artifact_members=None))
        capture(3)
        with store.engine.connect() as connection:
            joined = connection.scalar(_ALL_ARTIFACT_MEMBERS, {"conversation": conversation})
            figure = connection.scalar(select(Base.metadata.tables["conversations"].c.artifact_members))
        assert joined == figure == 3
    finally:
        store.engine.dispose()
