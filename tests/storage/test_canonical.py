"""The fast canonical JSON gives exactly `canonical_json`'s text, so node ids never depend on which ran."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from storage.canonical import compact_json, fast_canonical_json
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


def test_compact_json_refuses_what_json_refuses() -> None:
    import pytest
    with pytest.raises(ValueError):
        compact_json({"x": float("nan")})
