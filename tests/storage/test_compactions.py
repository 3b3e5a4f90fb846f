"""The `compactions` table (SQLite and PostgreSQL): written, read one tenant's at a time, filtered, purged."""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from storage.compactions import CompactionRecord
from storage.records import RecordStore

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=timezone.utc)
FIRST = CompactionRecord(id="cmp_1", tenant="acme", request_id="req_1", conversation_id="conv_a", source="gateway",
                         endpoint="responses", model="gpt", input_items=12, input_tokens=9000, forwarded_tokens=0,
                         output_items=1, output_bytes=180, created_at=NOW)


def test_compactions_are_written_and_read_per_tenant(store: RecordStore) -> None:
    second = replace(FIRST, id="cmp_2", request_id="req_2", source="provider", forwarded_tokens=4000,
                     created_at=NOW + timedelta(minutes=1))
    theirs = replace(FIRST, id="cmp_3", tenant="globex", conversation_id="conv_g")
    for record in (FIRST, second, theirs):
        store.record_compaction(record)
    assert store.compaction("cmp_1", "acme") == FIRST
    assert store.compaction("cmp_3", "acme") is None and store.compaction("cmp_3", None) == theirs
    assert [c.id for c in store.compactions("acme")] == ["cmp_2", "cmp_1"]  # newest first
    assert [c.id for c in store.compactions("acme", request_id="req_1")] == ["cmp_1"]
    assert [c.id for c in store.compactions("acme", conversation="conv_g")] == []
    assert {c.id for c in store.compactions(None)} == {"cmp_1", "cmp_2", "cmp_3"}
    assert FIRST.as_json()["created_at"] == NOW.isoformat()
    store.purge_tenant("acme", "test")
    assert store.compactions("acme") == [] and [c.id for c in store.compactions(None)] == ["cmp_3"]
