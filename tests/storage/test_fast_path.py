"""The request path's shortcuts give what the long way gives: replacement digests carried over from
the previous request, and SQLite's observation times read without an aware datetime."""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.pipeline.assembly_bases import RecentAssemblies
from policies.assembly_types import Decision
from storage.assembly_record import MAX_BASE_DEPTH, AssemblyRecord, message_digest, stored_decisions
from storage.path_reads import _sqlite_moment
from storage.record_types import as_utc


def _record(replaced: dict[int, dict[str, Any]], reasons: dict[int, str] | None = None,
            **fields: Any) -> AssemblyRecord:
    decided = tuple(Decision(i, "tool", "compacted", (reasons or {}).get(i, "epoch:4")) if i in replaced
                    else Decision.verbatim(i, "tool", 1) for i in range(8))
    return AssemblyRecord(policy_name="p", policy_version="1", assembler_version="1", tokens_original=1,
                          tokens_forwarded=1, messages_original=8, messages_forwarded=8, boundary_round=0,
                          epoch_round=4, decided=decided, omissions={}, timings_ms={}, replaced=replaced,
                          **fields)


def _memory(text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "c", "content": text}


def test_carried_digests_equal_recomputed_ones() -> None:
    earlier = _record({1: _memory("one"), 2: _memory("two"), 5: _memory("five")})
    now = {1: _memory("one"), 2: _memory("two, rendered again"), 3: _memory("three")}
    carried = _record(now, earlier_forwarded=earlier.forwarded)
    fresh = _record(now)
    assert carried.forwarded == fresh.forwarded
    assert carried.notable == fresh.notable
    assert {i: d for i, (_, d) in carried.forwarded.items()} == {i: message_digest(m)[0] for i, m in now.items()}
    # the same message in another place is hashed again (a digest is carried by place only)
    moved = _record({6: _memory("one")}, earlier_forwarded=earlier.forwarded)
    assert moved.forwarded[6][1] == message_digest(_memory("one"))[0]


def test_a_wrong_carried_digest_would_show() -> None:
    """The carried digest is taken only for an equal message: a changed one is hashed anew."""
    earlier = {1: (_memory("old"), "not a digest")}
    assert _record({1: _memory("new")}, earlier_forwarded=earlier).forwarded[1][1] == message_digest(_memory("new"))[0]
    assert _record({1: _memory("old")}, earlier_forwarded=earlier).forwarded[1][1] == "not a digest"


def test_recent_assemblies_hand_on_digests_and_the_stored_decisions_are_unchanged() -> None:
    recent = RecentAssemblies()
    first = _record({1: _memory("one"), 2: _memory("two")})
    recent.remember("req_1", first)
    second = recent.based(_record({1: _memory("one"), 2: _memory("two"), 4: _memory("four")}), "req_1")
    assert second.base_request_id == "req_1" and second.earlier_forwarded == first.forwarded
    plain = _record({1: _memory("one"), 2: _memory("two"), 4: _memory("four")}, base_request_id="req_1",
                    base_decisions=first.notable)
    assert stored_decisions(second) == stored_decisions(plain)
    assert [d["index"] for d in stored_decisions(second)] == [4]


def test_a_decision_equal_to_its_bases_is_held_once() -> None:
    """The notable decisions a request shares with its base are the base's own dicts (the gateway holds
    thousands of requests' decisions), and what is stored and read is as without the sharing."""
    recent = RecentAssemblies()
    first = _record({1: _memory("one"), 2: _memory("two"), 3: _memory("three")})
    recent.remember("req_1", first)
    # 1: the same; 2: another memory (another digest); 3: another reason; 4: new
    later = _record({1: _memory("one"), 2: _memory("two, rendered again"), 3: _memory("three"),
                     4: _memory("four")}, reasons={3: "stale"})
    second = recent.based(later, "req_1")
    assert second.notable[1] is first.notable[1]
    assert all(second.notable[i] is not first.notable[i] for i in (2, 3))
    unshared = _record({1: _memory("one"), 2: _memory("two, rendered again"), 3: _memory("three"),
                        4: _memory("four")}, reasons={3: "stale"})
    assert second.notable == unshared.notable
    plain = replace(unshared, base_request_id="req_1", base_decisions=first.notable)
    assert stored_decisions(second) == stored_decisions(plain)
    assert [d["index"] for d in stored_decisions(second)] == [2, 3, 4]


def test_recent_assemblies_hold_a_bounded_number_of_decisions() -> None:
    """Bounded by what the requests hold, not only by their count: the oldest go first, a request
    whose base went is stored whole, and one heavier than the whole budget is not held."""
    recent = RecentAssemblies(size=100, max_decisions=10)
    records = {f"req_{n}": _record({1: _memory(f"one {n}"), 2: _memory(f"two {n}")}) for n in range(5)}
    for request_id, record in records.items():  # 2 decisions + 2 replacements + 1 each
        recent.remember(request_id, record)
    assert len(recent) == 2 and recent.held == 10
    assert recent.based(_record({1: _memory("one")}), "req_2").base_request_id is None  # dropped: whole
    assert recent.based(_record({1: _memory("one")}), "req_4").base_request_id == "req_4"
    recent.remember("req_4", records["req_4"])  # again: counted once
    assert len(recent) == 2 and recent.held == 10
    heavy = _record({i: _memory(f"m{i}") for i in range(6)})
    recent.remember("req_heavy", heavy)
    assert recent.based(_record({1: _memory("one")}), "req_heavy").base_request_id is None
    assert len(recent) == 2 and recent.held == 10


def test_past_the_deepest_base_the_digests_still_carry_over() -> None:
    recent = RecentAssemblies()
    previous = "req_0"
    recent.remember(previous, _record({1: _memory("one")}))
    for n in range(1, MAX_BASE_DEPTH + 2):
        record = recent.based(_record({1: _memory("one")}), previous)
        assert record.earlier_forwarded is not None
        previous = f"req_{n}"
        recent.remember(previous, record)
        if record.base_request_id is None:
            break
    else:
        raise AssertionError("a chain this long is stored whole at some point")


@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9000, 1, 1)))
def test_sqlite_moments_equal_aware_timestamps(moment: datetime) -> None:
    aware = moment.replace(tzinfo=timezone.utc)
    engine = sqlalchemy.create_engine("sqlite://")
    table = sqlalchemy.Table("t", sqlalchemy.MetaData(), sqlalchemy.Column("at", sqlalchemy.DateTime(timezone=True)))
    table.create(engine)
    with engine.begin() as connection:
        connection.execute(table.insert(), {"at": aware})
        stored = connection.exec_driver_sql("SELECT at FROM t").scalar_one()
        assert isinstance(stored, str)
        assert _sqlite_moment(stored) == as_utc(datetime.fromisoformat(stored)).timestamp() == aware.timestamp()
    assert _sqlite_moment(aware) == aware.timestamp()
    assert _sqlite_moment(aware + timedelta(hours=2)) == (aware + timedelta(hours=2)).timestamp()


def test_a_decision_taken_again_gives_the_dict_made_for_it_before() -> None:
    """A fresh assembly's decision taken again from the request before is the same `Decision` instance:
    its notable dict is the one made then (not made and compared again), as long as the replacement's
    digest is the same; the dicts equal the long way's either way, and the instance stays equal to an
    equal decision made anew."""
    first = _record({1: _memory("one"), 2: _memory("two")})
    again = replace(first, replaced={1: _memory("one"), 2: _memory("two, rendered again")})
    assert again.decided[1] is first.decided[1]
    assert again.notable[1] is first.notable[1]  # same instance, same digest
    assert again.notable[2] is not first.notable[2]  # same instance, another replacement
    for record in (first, again):
        long_way = {d.index: {**d.as_dict(), **({"forwarded": record.forwarded[d.index][1]}
                                                 if d.index in record.forwarded else {})}
                    for d in record.decided if d.action != "verbatim"}
        assert record.notable == long_way
    assert first.decided[1] == Decision(1, "tool", "compacted", "epoch:4")
    assert hash(first.decided[1]) == hash(Decision(1, "tool", "compacted", "epoch:4"))
    restored = replace(first, decided=(), restored=[d.as_dict() for d in first.decided])
    assert restored.notable == first.notable
