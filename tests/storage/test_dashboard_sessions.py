"""Dashboard sessions in the database (SQLite and PostgreSQL): live while their row is, ended by
sign-out, by revoking the key that signed in, by removing config keys, by expiry and by tenant purge."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from policies.transcript import message_path
from storage.api_keys import ApiKeyRecord
from storage.dashboard_sessions import session_digest
from storage.record_types import RunStart
from storage.records import RecordStore
from storage.schema import SavingsLedgerDay

NOW = datetime.now(timezone.utc)
LATER = NOW + timedelta(hours=12)


def _made_key(store: RecordStore, key_id: str, tenant: str = "acme") -> ApiKeyRecord:
    record = ApiKeyRecord(id=key_id, tenant=tenant, name=None, digest=session_digest(key_id), prefix="gw-abc",
                          created_at=NOW, expires_at=None, revoked_at=None, models=("fake",), budget={}, limits={})
    store.create_api_key(record)
    return record


def test_a_session_lives_until_signed_out(store: RecordStore) -> None:
    store.start_dashboard_session("sid-1", "key-0123456789ab", "acme", LATER)
    store.start_dashboard_session("sid-admin", "key-ba9876543210", None, LATER)
    found = store.dashboard_session("sid-1")
    assert found is not None
    assert (found.key_id, found.tenant, found.api_key) == ("key-0123456789ab", "acme", None)
    assert abs((found.expires_at - LATER).total_seconds()) < 1
    assert store.dashboard_session("sid-unknown") is None
    assert store.end_dashboard_session("sid-1") is True
    assert store.dashboard_session("sid-1") is None
    assert store.end_dashboard_session("sid-1") is False  # a replayed sign-out finds nothing
    assert store.dashboard_session("sid-admin") is not None  # another session is untouched


def test_the_row_holds_a_digest_of_the_session_id_not_the_id(store: RecordStore) -> None:
    from sqlalchemy import text

    store.start_dashboard_session("secret-session-id", "key-0123456789ab", "acme", LATER)
    with store.engine.connect() as connection:
        ids = connection.scalars(text("SELECT id FROM dashboard_sessions")).all()
    assert ids == [session_digest("secret-session-id")]


def test_a_made_keys_session_reads_the_key_and_ends_with_its_revocation(store: RecordStore) -> None:
    _made_key(store, "key_aaa")
    _made_key(store, "key_bbb")
    store.start_dashboard_session("sid-a1", "key_aaa", "acme", LATER)
    store.start_dashboard_session("sid-a2", "key_aaa", "acme", LATER)
    store.start_dashboard_session("sid-b", "key_bbb", "acme", LATER)
    found = store.dashboard_session("sid-a1")
    assert found is not None and found.api_key is not None
    assert (found.api_key.id, found.api_key.models, found.api_key.revoked_at) == ("key_aaa", ("fake",), None)
    revoked = store.revoke_api_key("key_aaa")
    assert revoked is not None and revoked.revoked_at is not None
    assert store.dashboard_session("sid-a1") is None and store.dashboard_session("sid-a2") is None
    assert store.dashboard_session("sid-b") is not None


def test_removed_config_keys_end_their_sessions(store: RecordStore) -> None:
    for sid, key in (("s1", "key-111111111111"), ("s2", "key-111111111111"), ("s3", "key-222222222222"),
                     ("s4", "key-333333333333")):
        store.start_dashboard_session(sid, key, "acme", LATER)
    assert store.end_dashboard_sessions_of_keys([]) == 0
    assert store.end_dashboard_sessions_of_keys({"key-111111111111", "key-222222222222"}) == 3
    assert [store.dashboard_session(s) is not None for s in ("s1", "s2", "s3", "s4")] == [False, False, False, True]


def test_expired_sessions_are_refused_and_swept(store: RecordStore) -> None:
    store.start_dashboard_session("old", "key-0123456789ab", "acme", NOW - timedelta(seconds=1))
    store.start_dashboard_session("new", "key-0123456789ab", "acme", LATER)
    assert store.dashboard_session("old") is None  # refused before any sweep
    assert store.sweep_dashboard_sessions() == 1
    assert store.sweep_dashboard_sessions() == 0
    assert store.dashboard_session("new") is not None


def test_a_tenant_purge_ends_its_sessions(store: RecordStore) -> None:
    store.start_dashboard_session("acme-s", "key-0123456789ab", "acme", LATER)
    store.start_dashboard_session("globex-s", "key-ba9876543210", "globex", LATER)
    result = store.purge_tenant("acme", "test")
    assert result.counts["dashboard_sessions"] == 1
    assert store.dashboard_session("acme-s") is None and store.dashboard_session("globex-s") is not None


def test_models_used_names_a_tenants_models_only(store: RecordStore) -> None:
    for request_id, tenant, model in (("r1", "acme", "fake"), ("r2", "acme", "demo"), ("r3", "acme", "fake"),
                                      ("r4", "globex", "secret-model")):
        messages = [{"role": "user", "content": request_id}]
        store.ingest(message_path(tenant, messages), RunStart(
            request_id=request_id, tenant=tenant, participant="p", model=model, upstream_model=f"openai/{model}",
            stream=False))
    with store.engine.begin() as connection:  # runs garbage collection rolled up into the ledger count too
        connection.execute(SavingsLedgerDay.__table__.insert(), [{
            "tenant": "acme", "day": "2026-01-01", "model": "retired", "session": "s", "requests": 1,
            "first_at": NOW, "last_at": NOW}])
    assert store.models_used("acme") == ["demo", "fake", "retired"]
    assert store.models_used("globex") == ["secret-model"]
    assert store.models_used("initech") == []
