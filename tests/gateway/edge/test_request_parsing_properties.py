"""Request parsing never fails with anything but a 400 naming the problem (hypothesis)."""
from __future__ import annotations

import json
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequest
from gateway.wire.json_body import _parse_slowly, parse_json_object
from gateway.wire.openai_chat import OPENAI_CHAT
from policies.transcript import message_path

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "robot", 5, None])
parts = st.one_of(json_values, st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "input_audio",
                                                                                "file", "refusal", "other"])},
                                                       optional={"text": json_values, "image_url": json_values,
                                                                 "input_audio": json_values, "file": json_values}))
messages = st.fixed_dictionaries(
    {"role": roles},
    optional={"content": st.one_of(st.text(), st.lists(parts, max_size=3), json_values),
              "name": json_values, "tool_call_id": st.one_of(st.text(max_size=5), json_values),
              "tool_calls": st.lists(st.fixed_dictionaries(
                  {"id": st.one_of(st.text(max_size=5), json_values),
                   "function": st.fixed_dictionaries({"name": st.one_of(st.text(max_size=5), json_values),
                                                      "arguments": st.one_of(st.text(), json_values)})}), max_size=2)})
bodies = st.fixed_dictionaries(
    {"model": st.one_of(st.just("fake"), json_values), "messages": st.lists(messages, max_size=4)},
    optional={"stream": json_values, "tools": json_values, "stream_options": json_values, "temperature": json_values,
              "n": json_values, "stop": json_values, "extra_field": json_values})


def parse(raw: bytes) -> Any:
    try:
        request = OPENAI_CHAT.parse(raw)
    except InvalidRequest as error:
        assert error.status_code == 400 and error.message
        return None
    # What parses can be hashed into the message tree and stored as UTF-8.
    for node in message_path("t", request.messages):
        json.dumps(node.message, ensure_ascii=False).encode("utf-8")
    return request


@settings(max_examples=400, deadline=None)
@given(bodies)
def test_any_shaped_body_parses_or_is_a_400(body: dict) -> None:
    request = parse(json.dumps(body).encode())
    if request is not None:
        assert request.messages == body["messages"] and request.model == body["model"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_parse_or_are_a_400(raw: bytes) -> None:
    parse(raw)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
       st.sampled_from(["content", "name", "tool_call_id"]))
def test_lone_surrogates_are_a_400_naming_where(surrogates: str, field: str) -> None:
    # A high surrogate followed by a low one is a valid pair (one character beyond the BMP).
    assume(any(0xD800 <= ord(c) <= 0xDFFF for c in json.loads(json.dumps(surrogates))))
    message = {"role": "tool" if field == "tool_call_id" else "user", "content": "x", field: surrogates}
    raw = json.dumps({"model": "fake", "messages": [message]}).encode()  # escaped as \\udXXX
    try:
        OPENAI_CHAT.parse(raw)
    except InvalidRequest as error:
        assert error.param is not None and error.param.startswith("messages[0]")
    else:
        raise AssertionError("a lone surrogate was accepted")


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5))
def test_a_body_reads_as_json_loads_reads_it(body: dict) -> None:
    """orjson reads most bodies (it is faster); what it reads equals what `json.loads` reads, floats,
    64-bit-and-larger integers and unicode included."""
    for raw in (json.dumps(body).encode(), json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")):
        try:
            expected = json.loads(raw)
        except ValueError:
            continue
        try:
            assert parse_json_object(raw) == expected
        except InvalidRequest:
            assert "\\ud" in raw.decode("utf-8", "replace").lower() or any(
                0xD800 <= ord(ch) <= 0xDFFF for ch in raw.decode("utf-8", "surrogatepass"))


def _outcome(parse_with: Any, raw: bytes) -> Any:
    try:
        return repr(parse_with(raw))  # repr: 1 and 1.0 apart
    except InvalidRequest as error:
        return ("error", error.message, error.param)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode()),
                 st.dictionaries(st.text(max_size=8), json_values, max_size=5).map(lambda v: json.dumps(v).encode()),
                 st.integers(min_value=-(2 ** 70), max_value=2 ** 70).map(lambda n: b'{"n": %d}' % n)))
def test_the_fast_parse_answers_as_the_slow_one(raw: bytes) -> None:
    """orjson's parse is taken only where it gives `json.loads`'s very value; else the slow path's
    value or error is the answer."""
    assert _outcome(parse_json_object, raw) == _outcome(_parse_slowly, raw)


def test_what_orjson_reads_otherwise_takes_the_slow_path() -> None:
    for raw in (b'{"n": 123456789012345678901234567890}', b'{"n": -9223372036854775809}', b'{"x": 1e400}',
                b'{"x": NaN}', b'\xef\xbb\xbf{"a": 1}', b'{"a": "\\ud800"}',
                b'{"a": ' + b'[' * 63 + b']' * 63 + b'}', b'{"a": ' + b'[' * 64 + b']' * 64 + b'}'):
        assert _outcome(parse_json_object, raw) == _outcome(_parse_slowly, raw)


def _long_body(messages: list) -> bytes:
    head = [{"role": "system", "content": "agent"}] + [
        {"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n}"} for n in range(17)]
    return json.dumps({"model": "fake", "messages": head + messages}).encode()


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, min_size=1, max_size=3))
def test_messages_checked_before_answer_as_when_checked_afresh(tail: list) -> None:
    """A long transcript's messages that passed before are not checked again (gateway/wire/seen_messages.py);
    the answer, value or error and where it is, is the same as a fresh check's."""
    from gateway.wire import openai_chat
    from gateway.wire.seen_messages import SeenMessages

    raw = _long_body(tail)
    openai_chat._SEEN = SeenMessages()
    fresh = _chat_outcome(raw)
    _chat_outcome(_long_body([]))  # the head is seen now
    again = [_chat_outcome(raw), _chat_outcome(raw)]  # and, if it passed, the tail too
    assert again == [fresh, fresh]


def test_a_bad_message_after_a_seen_prefix_is_named_where_it_is() -> None:
    good = _long_body([])
    assert _chat_outcome(good)[0] == "ok"
    for bad, param in (({"role": "robot", "content": "x"}, "messages[18].role"),
                       ({"role": "tool", "content": "x"}, "messages[18].tool_call_id"),
                       ({"role": "user", "content": [{"type": "text"}]}, "messages[18].content[0].text")):
        outcome = _chat_outcome(_long_body([bad]))
        assert outcome[0] == "error" and outcome[2] == param, outcome


def _chat_outcome(raw: bytes) -> tuple:
    try:
        request = OPENAI_CHAT.parse(raw)
    except InvalidRequest as error:
        return ("error", error.message, error.param)
    return ("ok", request.model, request.messages, request.stream)


def _reference(raw: bytes) -> tuple:
    """The chat outcome with `json.loads`'s reading and nothing seen before."""
    from gateway.wire import openai_chat
    from gateway.wire.seen_messages import SeenMessages

    kept, openai_chat._SEEN = openai_chat._SEEN, SeenMessages()
    try:
        try:
            request = openai_chat.parse_chat_body(_parse_slowly(raw))
        except InvalidRequest as error:
            return ("error", error.message, error.param)
        return ("ok", request.model, repr(request.messages), request.stream)
    finally:
        openai_chat._SEEN = kept


def _chat_reading(raw: bytes) -> tuple:
    outcome = _chat_outcome(raw)
    return (*outcome[:2], repr(outcome[2]), outcome[3]) if outcome[0] == "ok" else outcome


def _nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


numbers = st.one_of(st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([1e19, 1e20, -1e20, 2.0 ** 64, 2 ** 63, 2 ** 64, 2 ** 64 - 1, -(2 ** 63) - 1]))
odd_messages = st.one_of(
    messages,
    st.builds(lambda n: {"role": "user", "content": "x", "extra": n}, numbers),
    st.builds(lambda d: {"role": "user", "content": "x", "extra": _nested(d)}, st.integers(55, 66)))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(odd_messages, min_size=1, max_size=2), min_size=1, max_size=4))
def test_chat_bodies_read_as_json_loads_reads_them_whatever_was_seen_before(tails: list) -> None:
    """The messages of a chat body are read by orjson and looked at only where not seen before
    (gateway/wire/json_body.py `parse_json_object_but`); whatever came before, each body's outcome (its
    value, 1 and 1.0 apart, or its error and where) is the one `json.loads` and a fresh check give."""
    from gateway.wire import openai_chat
    from gateway.wire.seen_messages import SeenMessages

    openai_chat._SEEN = SeenMessages()
    for n in range(len(tails)):
        raw = _long_body([m for tail in tails[: n + 1] for m in tail])
        assert _chat_reading(raw) == _reference(raw)


def test_a_float_seen_before_is_not_taken_for_an_integer_literal() -> None:
    """orjson reads `1e+20` and `100000000000000000000` (past 64 bits) as the same float, `json.loads` the
    second as an integer: a message seen with the float must not make the integer's message one seen before."""
    from gateway.wire import openai_chat
    from gateway.wire.seen_messages import SeenMessages

    openai_chat._SEEN = SeenMessages()
    after = {"role": "assistant", "content": "the last message, which is always looked at"}
    as_float = _long_body([{"role": "user", "content": "x", "extra": 1e20}, after])
    assert b"1e+20" in as_float
    for _ in range(2):
        assert repr(_chat_outcome(as_float)[2][-2]["extra"]) == "1e+20"
    as_integer = as_float.replace(b"1e+20", b"100000000000000000000")
    extra = _chat_outcome(as_integer)[2][-2]["extra"]
    assert extra == 10 ** 20 and type(extra) is int


def test_a_message_nested_too_deep_after_a_seen_prefix_is_a_400_naming_it() -> None:
    assert _chat_outcome(_long_body([]))[0] == "ok"
    outcome = _chat_outcome(_long_body([{"role": "user", "content": "x", "extra": _nested(70)}]))
    assert outcome[0] == "error" and outcome[2].startswith("messages[18].extra"), outcome
