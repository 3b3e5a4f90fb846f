"""The fast canonical JSON gives exactly `canonical_json`'s text, so node ids never depend on which ran."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.canonical import NodeIds, _orjson_may_differ, compact_json, compact_json_bytes, fast_canonical_json
from policies.transcript import canonical_json, message_path

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(),
)
_VALUES = st.recursive(_SCALARS, lambda children: st.one_of(
    st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)), max_leaves=20)


@given(_VALUES)
@settings(max_examples=400, deadline=None)
def test_the_same_text_as_canonical_json(value: object) -> None:
    assert fast_canonical_json(value) == canonical_json(value)


def test_the_values_orjson_writes_differently_fall_back() -> None:
    for value in ({"x": 1e-07}, {"x": 2.5e-05}, [2 ** 64], {"x": "\ud800"}, {"a": {"b": [1.5, -0.0]}}):
        assert fast_canonical_json(value) == canonical_json(value)
    assert fast_canonical_json({"b": "\x7f\u2028\x1f\"\\", "a": "é😀"}) == json.dumps(
        {"a": "é😀", "b": "\x7f\u2028\x1f\"\\"}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_paths_are_the_same_with_either() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"t\": 1e-07}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "ok", "score": 1e-07}]}]
    assert [n.id for n in message_path("acme", messages, fast_canonical_json)] == [
        n.id for n in message_path("acme", messages)]


@given(_VALUES)
@settings(max_examples=400, deadline=None)
def test_compact_json_is_the_sdk_text(value: object) -> None:
    assert compact_json(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


_FLOATS = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                   st.floats(min_value=1e-12, max_value=1e-3), st.floats(min_value=-1e-3, max_value=-1e-12))


@given(st.one_of(_VALUES, st.lists(_FLOATS, max_size=8), st.dictionaries(st.text(max_size=4), _FLOATS, max_size=4)))
@settings(max_examples=600, deadline=None)
def test_compact_json_of_finite_values_is_the_sdk_text_without_the_walk(value: object) -> None:
    assert compact_json(value, finite=True) == json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                                                          allow_nan=False)


def test_compact_json_of_finite_values_falls_back_where_orjson_writes_otherwise() -> None:
    for value in ([1e-07], {"x": 4.6700813568056094e-05}, [-2.5e-9, 1.0], [2 ** 64], {"x": "\ud800"},
                  {"x": "0.0000 and 3e-5, in text"}, [1e16, 1e-300, 5e-324, 0.0001, 123456789.123]):
        assert compact_json(value, finite=True) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _may_differ_by_loop(text: bytes) -> bool:
    """The check spelled out position by position: the reference for the search by `bytes.find`."""
    digits = b"0123456789"
    return b"0.0000" in text or any(
        text[at:at + 2] == b"e-" and at > 0 and text[at - 1] in digits and at + 2 < len(text)
        and text[at + 2] in digits and (at + 3 == len(text) or text[at + 3] not in digits)
        for at in range(len(text)))


@given(st.binary(max_size=40) | st.text(alphabet="0123456789e-. x", max_size=40).map(str.encode))
@settings(max_examples=2000, deadline=None)
def test_the_float_check_finds_every_short_exponent_and_nothing_else(text: bytes) -> None:
    assert _orjson_may_differ(text) == _may_differ_by_loop(text)


@given(st.one_of(_VALUES, st.lists(_FLOATS, max_size=8)))
@settings(max_examples=300, deadline=None)
def test_compact_json_bytes_are_the_text_encoded(value: object) -> None:
    assert compact_json_bytes(value) == compact_json(value, finite=True).encode()


def test_compact_json_refuses_what_json_refuses() -> None:
    import pytest
    with pytest.raises(ValueError):
        compact_json({"x": float("nan")})


_MESSAGES = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": _VALUES},
    optional={"tool_call_id": st.sampled_from(["c1", "c2"]), "name": st.text(max_size=4)}), min_size=1, max_size=6)


@given(st.lists(_MESSAGES, min_size=1, max_size=4))
@settings(max_examples=300, deadline=None)
def test_remembered_node_ids_are_the_computed_ones(transcripts: list[list[dict]]) -> None:
    """Whatever was seen before, in whatever order, a remembered id is the id `node_id` computes."""
    ids = NodeIds(limit=8)  # small, so trimming happens too
    for messages in [*transcripts, *transcripts]:
        assert message_path("acme", messages, ids=ids) == message_path("acme", messages)
        assert len(ids) <= 8


@given(st.lists(_MESSAGES, min_size=1, max_size=4), st.data())
@settings(max_examples=300, deadline=None)
def test_a_path_placed_with_its_digests_is_the_computed_one(transcripts: list[list[dict]], data: st.DataObject) -> None:
    """`NodeIds.path` (the request path's loop, handed the digests parsing worked out, some unknown) places
    every message where `message_path` does, whatever was seen before."""
    from policies.canonical import exact_digest
    ids = NodeIds(limit=8)
    for messages in [*transcripts, *transcripts]:
        digests = [exact_digest(m) if data.draw(st.booleans()) else None for m in messages]
        assert ids.path("acme", messages, digests) == message_path("acme", messages)
        assert ids.path("acme", messages, digests[:-1]) == message_path("acme", messages)
        assert len(ids) <= 8


def test_values_equal_in_python_but_not_in_json_get_their_own_ids() -> None:
    """`1 == 1.0 == True` in Python; as JSON they are different messages, with different ids."""
    ids = NodeIds()
    variants = [{"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "x", "n": n}]}
                for n in (1, 1.0, True)]
    seen = [message_path("acme", [m], ids=ids)[0].id for m in variants]
    assert seen == [message_path("acme", [m])[0].id for m in variants]
    assert len(set(seen)) == 3


def test_ids_depend_on_tenant_and_parent_whatever_is_remembered() -> None:
    ids = NodeIds()
    messages = [{"role": "user", "content": "same"}, {"role": "user", "content": "same"}]
    ours, theirs = message_path("acme", messages, ids=ids), message_path("globex", messages, ids=ids)
    assert ours[0].id != theirs[0].id and ours[0].id != ours[1].id
    assert ours == message_path("acme", messages) and theirs == message_path("globex", messages)


def test_the_digests_parsing_works_out_are_the_node_id_cache_keys() -> None:
    from gateway.wire.seen_messages import message_digests
    from policies.canonical import exact_digest
    messages = [{"role": "user", "content": "hi"}, {"role": "tool", "content": "\ud800", "tool_call_id": "c"},
                {"role": "user", "content": 1.0}, {"role": "user", "content": 1}]
    assert message_digests(messages) == [exact_digest(m) for m in messages]
    assert message_digests(messages)[1] is None and message_digests(messages)[2] != message_digests(messages)[3]
    ids, fresh = NodeIds(), NodeIds()
    parent = None
    for message, digest in zip(messages, message_digests(messages)):
        assert ids("acme", parent, message, digest) == fresh("acme", parent, message)
        parent = fresh("acme", parent, message)


_TURNS = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]),
                                         "content": st.sampled_from(["a", "b", "c", 1, 1.0])}),
                  min_size=1, max_size=12)


@given(_TURNS, st.lists(st.tuples(st.integers(0, 12), st.integers(-1, 11), st.integers(0, 4)), max_size=12))
@settings(max_examples=300, deadline=None)
def test_a_path_resumed_from_an_earlier_request_is_the_computed_one(messages: list[dict], requests: list) -> None:
    """Requests that resend an earlier request's prefix, longer or shorter by a few messages, some with a
    message changed anywhere (the same length and last message as a remembered path, a different middle),
    are placed where `message_path` places them: a remembered path is taken only for the exact prefix."""
    from policies.canonical import exact_digest
    ids = NodeIds(limit=8, paths=4)
    for length, changed, value in requests:
        sent = [dict(m) for m in messages[:max(1, length)]]
        if 0 <= changed < len(sent) - 1:
            sent[changed]["content"] = ["a", "b", "c", 1, 1.0][value]
        digests = [exact_digest(m) for m in sent]
        assert ids.path("acme", sent, digests) == message_path("acme", sent)
        assert ids.path("globex", sent, digests) == message_path("globex", sent)


def test_a_remembered_path_is_taken_only_for_the_same_messages_before_its_last() -> None:
    """Two requests of the same length ending in the same message, different before it: the second is
    not placed with the first's ids (the digests of every message are compared, not the last one's)."""
    from policies.canonical import exact_digest
    ids = NodeIds()
    first = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "z"}]
    second = [first[0], {"role": "assistant", "content": "y"}, first[2]]
    third = [*first, {"role": "assistant", "content": "w"}]
    for messages in (first, second, third, second):
        assert ids.path("acme", messages, [exact_digest(m) for m in messages]) == message_path("acme", messages)
    assert ids._resumed("acme", [exact_digest(m) for m in third]) is not None  # taken where it may be
