"""gateway/wire/body_layouts.py: the digests it takes over from a recent body are always the digests of
the messages the body's parse holds, whatever the spacing, key order or trickery of the bytes."""
from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.wire import body_layouts
from gateway.wire.body_layouts import BodyLayouts
from gateway.wire.openai_chat import OpenAIChat
from policies.canonical import exact_digest


def transcript(rounds: int, tag: str = "", pad: int = 1) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": f"Fix the failing test{tag}."}]
    for n in range(rounds):
        call = f"call_{tag}{n}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"n": n})}}]})
        messages.append({"role": "tool", "tool_call_id": call, "content": f"line {n}: \"quoted\" ü \\ {'x' * n * pad}"})
    return messages


def variant(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same first two messages (so the same key in the layouts) and count; other, short results."""
    return messages[:2] + [{**m, "content": "other"} if m["role"] == "tool" else m for m in messages[2:]]


def write(body: dict[str, Any], style: str) -> bytes:
    if style == "orjson":
        return orjson.dumps(body)
    if style == "compact":  # httpx's json=, as the OpenAI SDK sends it
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    if style == "spaced":
        return json.dumps(body).encode()
    return json.dumps(body, indent=2).encode() + b"\n"


def body_of(messages: list[dict[str, Any]], order: str) -> dict[str, Any]:
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    if order == "first":
        return {"messages": messages, "model": "fake", "tools": tools}
    if order == "middle":
        return {"model": "fake", "messages": messages, "tools": tools}
    return {"model": "fake", "tools": tools, "messages": messages}


def fresh(raw: bytes) -> list[bytes | None]:
    return [exact_digest(m) for m in orjson.loads(raw)["messages"]]


STYLES = ["orjson", "compact", "spaced", "indented"]
ORDERS = ["first", "middle", "last"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.integers(0, 12), st.sampled_from(STYLES), st.sampled_from(ORDERS),
                                st.sampled_from(["", "b"])), min_size=1, max_size=12))
def test_digests_are_those_of_the_parse(steps: list[tuple[int, str, str, str]]) -> None:
    """Agents grow, resend, shorten, branch and reformat their transcripts: every body's digests are
    its own messages', whether taken over or computed."""
    layouts = BodyLayouts()
    for rounds, style, order, tag in steps:
        raw = write(body_of(transcript(rounds, tag), order), style)
        assert layouts.lay_out(raw, orjson.loads(raw)).digests == fresh(raw)


def counted(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    digested: list[bytes] = []
    real = body_layouts.text_digest

    def counting(text: bytes) -> bytes:
        digested.append(text)
        return real(text)

    monkeypatch.setattr(body_layouts, "text_digest", counting)
    return digested


@pytest.mark.parametrize("style", STYLES)
def test_a_grown_transcript_digests_only_its_new_messages(monkeypatch: pytest.MonkeyPatch, style: str) -> None:
    layouts = BodyLayouts()
    digested = counted(monkeypatch)
    first = write(body_of(transcript(10), "last"), style)
    second = write(body_of(transcript(10), "last"), style)  # the same bytes again: a second sight
    assert layouts.lay_out(first, orjson.loads(first)).digests == fresh(first)
    assert layouts.lay_out(second, orjson.loads(second)).digests == fresh(second)
    digested.clear()
    grown = write(body_of(transcript(11), "last"), style)
    assert layouts.lay_out(grown, orjson.loads(grown)).digests == fresh(grown)
    assert len(digested) == 2  # the new round's call and result
    digested.clear()
    assert layouts.lay_out(first, orjson.loads(first)).digests == fresh(first)  # the resend without it
    assert digested == []


def test_a_body_of_orjson_spacing_is_laid_out_at_first_sight(monkeypatch: pytest.MonkeyPatch) -> None:
    layouts = BodyLayouts()
    first = orjson.dumps(body_of(transcript(10), "first"))
    layouts.lay_out(first, orjson.loads(first))
    digested = counted(monkeypatch)
    grown = orjson.dumps(body_of(transcript(11), "first"))
    assert layouts.lay_out(grown, orjson.loads(grown)).digests == fresh(grown)
    assert len(digested) == 2


def _laid_out(layouts: BodyLayouts, raw: bytes) -> None:
    for _ in range(2):
        assert layouts.lay_out(raw, orjson.loads(raw)).digests == fresh(raw)
    assert len(layouts) >= 1


@pytest.mark.parametrize("style", STYLES)
def test_a_second_messages_key_after_the_shared_bytes_is_not_taken_for_them(style: str) -> None:
    """`{"messages": [<the known messages>, ...], "messages": [<others>]}`: the parser keeps the second
    list; its digests are the second list's."""
    layouts = BodyLayouts()
    known = write(body_of(transcript(10, pad=400), "first"), style)
    _laid_out(layouts, known)
    others = write({"m": variant(transcript(10))}, style)
    cut = known.rstrip().rstrip(b"}").rstrip()
    for key in (b'"messages"', b'"messag\\u0065s"'):
        raw = cut + b"," + key + b":" + others[others.index(b"["):others.rindex(b"]") + 1] + b"}"
        parsed = orjson.loads(raw)
        assert parsed["messages"] == variant(transcript(10))
        assert layouts.lay_out(raw, parsed).digests == fresh(raw)


@pytest.mark.parametrize("style", STYLES)
def test_a_copy_of_the_messages_under_another_key_is_not_taken_for_them(style: str) -> None:
    """A body whose first array of messages is another key's value (nested or not), the real ones
    after it: laid out, then grown, its digests are the real messages'."""
    layouts = BodyLayouts()
    for rounds in (10, 10, 11):
        real = write({"messages": variant(transcript(rounds))}, style)
        decoy = write({"messages": transcript(rounds, pad=50)}, style)
        decoy_array = decoy[decoy.index(b"["):decoy.rindex(b"]") + 1]
        raw = (b'{"metadata":{"messages":' + decoy_array + b'},"copy":' + decoy_array + b',"messages":'
               + real[real.index(b"["):real.rindex(b"]") + 1] + b"}")
        parsed = orjson.loads(raw)
        assert parsed["messages"] == variant(transcript(rounds))
        assert layouts.lay_out(raw, parsed).digests == fresh(raw)


def test_a_changed_message_inside_the_shared_length_is_digested_again() -> None:
    layouts = BodyLayouts()
    messages = transcript(10)
    raw = orjson.dumps(body_of(messages, "last"))
    _laid_out(layouts, raw)
    messages[7] = {**messages[7], "content": messages[7]["content"] + "!"}  # a result edited in place
    edited = orjson.dumps(body_of(messages, "last"))
    assert layouts.lay_out(edited, orjson.loads(edited)).digests == fresh(edited)
    messages[7] = {**messages[7], "content": 1.0}  # same length in bytes as `1`? a type change all the same
    retyped = orjson.dumps(body_of(messages, "last"))
    assert layouts.lay_out(retyped, orjson.loads(retyped)).digests == fresh(retyped)


def test_held_bodies_are_bounded() -> None:
    layouts = BodyLayouts(limit_bytes=20_000, per_key=2)
    for tag in range(30):
        raw = orjson.dumps(body_of(transcript(8, str(tag)), "last"))
        layouts.lay_out(raw, orjson.loads(raw))
    assert 0 < layouts.held_bytes <= 20_000 + len(raw)
    assert layouts.held_bytes == sum(len(layout.raw) for known in layouts._layouts.values() for layout in known)


def test_the_chat_parse_hands_on_the_same_digests() -> None:
    """Through the wire format, as the pipeline parses: a sequence of growing bodies gives each body the
    digests of its own messages, and a message seen is still found seen."""
    chat = OpenAIChat()
    for rounds in (10, 10, 11, 10, 12, 12):
        raw = json.dumps(body_of(transcript(rounds), "middle")).encode()
        neutral = chat.parse(raw)
        assert neutral.digests == fresh(raw)
        assert neutral.messages == orjson.loads(raw)["messages"]


def test_a_grown_transcript_is_still_checked_where_it_grew(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body that shares its first messages with a body that passed is checked from the last of them
    that is no tool message: an orphan tool message in its new round, or a call answered again, is a
    400 naming it, as without the layouts."""
    from gateway.errors import InvalidRequest
    from gateway.wire import openai_chat
    chat = OpenAIChat()
    prefixes: list[int] = []
    real = openai_chat.orphan_tool_messages

    def orphans(messages: list[dict[str, Any]], checked: int = 0) -> list[tuple[int, str]]:
        prefixes.append(checked)
        return real(messages, checked)

    monkeypatch.setattr(openai_chat, "orphan_tool_messages", orphans)
    for tag, extra, words in (("o1", {"role": "tool", "tool_call_id": "call_nobody", "content": "late"},
                               "answers no call"),
                              ("o2", None, "answered twice")):
        messages = transcript(10, tag=tag)
        for _ in range(2):  # laid out on the second sight, and checked
            chat.parse(json.dumps(body_of(messages, "last")).encode())
        grown = messages + [extra or dict(messages[-1])]
        with pytest.raises(InvalidRequest, match=words) as error:
            chat.parse(json.dumps(body_of(grown, "last")).encode())
        assert error.value.param == f"messages[{len(messages)}]"
        assert prefixes[-1] == len(messages)  # checked from the end of the body that passed
