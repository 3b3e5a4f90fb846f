"""gateway/wire/body_layouts.py `spliced`: a chat body that begins with a recent checked body's bytes is
parsed without the messages it shares, and what the parse gives (the request, or the 400) is always what
parsing the whole body gives, whatever the spacing, the key order or the trickery after the shared bytes.
Through the app, nothing downstream changes the message objects a later request shares."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequest
from gateway.wire import body_layouts, openai_chat
from gateway.wire.body_layouts import BodyLayouts
from gateway.wire.openai_chat import OpenAIChat
from gateway.wire.seen_messages import MIN_MESSAGES
from tests.conftest import TENANT_KEY, RunningGateway, settings_for, start_gateway
from tests.gateway.wire.test_body_layouts import ORDERS, STYLES, body_of, transcript, variant, write
from testkit.fake_upstream import FakeUpstream


@pytest.fixture
def layouts(monkeypatch: pytest.MonkeyPatch) -> Iterator[BodyLayouts]:
    """The chat format's layouts, fresh, splicing bodies of any size; `spliced_count` counts the splices."""
    fresh = BodyLayouts()
    monkeypatch.setattr(openai_chat, "_LAYOUTS", fresh)
    monkeypatch.setattr(body_layouts, "MIN_SPLICED_BYTES", 0)
    yield fresh


def counting_splices(layouts: BodyLayouts, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each parse found a splice (before `lay_out` confirmed it)."""
    found: list[bool] = []
    real = layouts.spliced

    def spliced(raw: bytes) -> Any:
        result = real(raw)
        found.append(result is not None)
        return result

    monkeypatch.setattr(layouts, "spliced", spliced)
    return found


def outcome(parse: Callable[[bytes], Any], raw: bytes) -> tuple[str, Any]:
    """What a parse gives: the request's messages, model and params, or the 400's words."""
    try:
        neutral = parse(raw)
    except InvalidRequest as exc:
        return "error", (exc.message, exc.param, exc.code)
    return "request", (neutral.messages, neutral.model, neutral.params, neutral.digests)


def whole(raw: bytes) -> tuple[str, Any]:
    """The parse with no recent body to share: fresh layouts, whose first sight of a body splices nothing."""
    saved = openai_chat._LAYOUTS
    openai_chat._LAYOUTS = BodyLayouts()
    try:
        return outcome(OpenAIChat().parse, raw)
    finally:
        openai_chat._LAYOUTS = saved


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("order", ORDERS)
def test_a_grown_body_shares_the_earlier_bodys_messages(layouts: BodyLayouts, monkeypatch: pytest.MonkeyPatch,
                                                       style: str, order: str) -> None:
    chat = OpenAIChat()
    chat.parse(write(body_of(transcript(10), order), style))  # a spacing of its own is laid out at second sight
    first = chat.parse(write(body_of(transcript(10), order), style))
    splices = counting_splices(layouts, monkeypatch)
    raw = write(body_of(transcript(11), order), style)
    grown = chat.parse(raw)
    assert splices == [True]
    assert grown.messages == orjson.loads(raw)["messages"]
    assert outcome(chat.parse, raw) == whole(raw)
    # messages 1..21 are the first body's own objects (all of it but its first); the first and the new ones were parsed
    assert len(first.messages) == 22 and len(grown.messages) == 24
    assert all(grown.messages[i] is first.messages[i] for i in range(1, 22))
    assert grown.messages[0] is not first.messages[0]


def test_a_resend_and_a_shorter_body_are_spliced_too(layouts: BodyLayouts, monkeypatch: pytest.MonkeyPatch) -> None:
    chat = OpenAIChat()
    chat.parse(orjson.dumps(body_of(transcript(12), "first")))
    splices = counting_splices(layouts, monkeypatch)
    for rounds in (12, 11, 12):  # the same bytes, a body without the last round, the longer one again
        raw = orjson.dumps(body_of(transcript(rounds), "first"))
        assert outcome(chat.parse, raw) == whole(raw)
    assert splices == [True, True, True]


@pytest.mark.parametrize("style", STYLES)
def test_a_second_messages_key_after_the_shared_bytes_is_the_parse(layouts: BodyLayouts, style: str) -> None:
    """`{"messages": [<the known messages>], "messages": [<others>]}`: the parser keeps the second
    list, and so does the splice's result (or its 400, word for word)."""
    chat = OpenAIChat()
    known = write(body_of(transcript(10, pad=40), "first"), style)
    chat.parse(known)
    chat.parse(known)
    cut = known.rstrip().rstrip(b"}").rstrip()
    others = write({"m": variant(transcript(10))}, style)
    array = others[others.index(b"["):others.rindex(b"]") + 1]
    for second in (array, b"[0," + array[1:], b"[]", b"[0]"):
        for key in (b'"messages"', b'"messag\\u0065s"'):
            raw = cut + b"," + key + b":" + second + b"}"
            assert outcome(chat.parse, raw) == whole(raw)


@pytest.mark.parametrize("style", STYLES)
def test_decoy_arrays_of_messages_before_the_real_ones_change_nothing(layouts: BodyLayouts, style: str) -> None:
    """The bytes a held body is looked up by are found by the first `"messages": [` anywhere (a hint):
    with copies of the messages under other keys before the real ones, each body parses as it does whole."""
    chat = OpenAIChat()
    for rounds in (10, 10, 11, 11, 12):
        real = write({"messages": variant(transcript(rounds))}, style)
        decoy = write({"messages": transcript(rounds, pad=50)}, style)
        decoy_array = decoy[decoy.index(b"["):decoy.rindex(b"]") + 1]
        raw = (b'{"metadata":{"messages":' + decoy_array + b'},"copy":' + decoy_array + b',"messages":'
               + real[real.index(b"["):real.rindex(b"]") + 1] + b"}")
        assert outcome(chat.parse, raw) == whole(raw)


def test_bad_json_after_the_shared_bytes_is_the_whole_parses_400(layouts: BodyLayouts) -> None:
    chat = OpenAIChat()
    known = orjson.dumps(body_of(transcript(10), "first"))
    chat.parse(known)
    end = known.index(b"]", known.rindex(b'"tool_call_id"'))  # the messages' closing bracket
    for tail in (b",NaN]}", b",{\"role\":\"tool\",\"content\":\"\\ud800\"}]}", b",1e999]}", b"]", b",{}]}",
                 b",{\"role\":\"user\",\"content\":" + b"[" * 80 + b"]" * 80 + b"}]}"):
        raw = known[:end] + tail
        assert outcome(chat.parse, raw) == whole(raw)


@pytest.mark.parametrize("raw", [b'{"messages":[]}', b'{"messages":[{"role":"user","content":"hi"}]}',
                                 b'{"messages":[{"role":"user","content":"hi"}],"model":"m"}', b'{"messages":[',
                                 b'{"messages":[1,2]}', b'{"messages":{}}', b'{"messages":[{"role":"user"}', b"[]",
                                 b'{"model":"m","messages":[{"role":"user","content":"hi"}]}', b""])
def test_a_body_of_fewer_than_two_messages_or_none_parses_as_it_does_whole(layouts: BodyLayouts,
                                                                           raw: bytes) -> None:
    chat = OpenAIChat()
    for _ in range(2):
        chat.parse(orjson.dumps(body_of(transcript(10), "first")))
    assert layouts.spliced(raw) is None
    assert outcome(chat.parse, raw) == whole(raw)


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False)
                           | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool", "nobody"]),
                                 "content": st.text(max_size=30) | JSON_VALUES},
                                optional={"tool_call_id": st.text(max_size=6), "name": st.text(max_size=6)})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.integers(7, 12), kept=st.integers(2, 26), added=st.lists(MESSAGE | JSON_VALUES, max_size=3),
       after=st.dictionaries(st.sampled_from(["messages", "model", "tools", "stream", "x", "messag\\u0065s"]),
                             JSON_VALUES, max_size=2),
       style=st.sampled_from(STYLES), order=st.sampled_from(ORDERS))
def test_any_body_after_a_known_one_parses_as_it_does_whole(
        layouts: BodyLayouts, rounds: int, kept: int, added: list[Any], after: dict[str, Any], style: str,
        order: str) -> None:
    """A known body, then one that keeps some of its messages and goes on with anything (messages or
    not, valid or not, a second `messages` key or a decoy after them): the same request or the same 400."""
    chat = OpenAIChat()
    known = transcript(rounds)
    for _ in range(2):
        chat.parse(write(body_of(known, order), style))
    body = body_of(known[:kept] + added, order)
    try:
        raw = write(body, style)
    except TypeError:  # orjson writes no integer past 64 bits
        raw = write(body, "compact")
    extra = b"".join(b',"' + key.encode() + b'":' + json.dumps(value).encode() for key, value in after.items())
    raw = raw.rstrip().removesuffix(b"}") + extra + b"}"
    assert outcome(chat.parse, raw) == whole(raw)


def test_the_parsed_messages_held_are_bounded() -> None:
    layouts = BodyLayouts(parsed_bytes=30_000, per_key=2)
    chat_layouts = []
    for tag in range(20):
        for rounds in (6, 7, 8):
            raw = orjson.dumps(body_of(transcript(rounds, str(tag), pad=20), "first"))
            laid = layouts.lay_out(raw, orjson.loads(raw))
            layouts.passed(laid, orjson.loads(raw)["messages"])
            chat_layouts.append(laid.layout)
    holding = [layout for known in layouts._parsed.values() for layout in known]
    assert 0 < layouts.parsed_held_bytes <= 30_000
    assert layouts.parsed_held_bytes == sum(len(layout.raw) for layout in holding)
    assert all(len(known) <= 2 for known in layouts._parsed.values())
    assert all(layout.messages is None for layout in chat_layouts if all(layout is not h for h in holding))


@pytest.fixture(params=["coding-agent", "default", "passthrough"])
def gateway(request: pytest.FixtureRequest, fake: FakeUpstream, sqlite_url: str,
            tmp_path: Path) -> Iterator[RunningGateway]:
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": request.param}]
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, tenants=tenants), fake)
    yield running
    server.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_through_the_app_no_shared_message_is_changed(layouts: BodyLayouts, monkeypatch: pytest.MonkeyPatch,
                                                      gateway: RunningGateway, fake: FakeUpstream,
                                                      stream: bool, request: pytest.FixtureRequest) -> None:
    """Rounds of an agent whose old results the gateway compacts (memories, arguments compacted) or, under
    the other policies, forwards as they are: every request of a transcript long enough to be laid out
    is spliced but the first, and every message object held for the next one is still what its body's
    bytes say, after capture, assembly, the upstream call (JSON or streamed) and the outcome have had it."""
    splices = counting_splices(layouts, monkeypatch)
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Find the failing test and fix it."}]
    for n in range(24):
        call = f"call_{n}"
        messages += [
            {"role": "assistant", "content": f"Reading part {n}." + " why" * 60, "tool_calls": [
                {"id": call, "type": "function", "function": {
                    "name": "read_file", "arguments": json.dumps({"path": f"src/m{n}.py", "pad": "x" * 400})}}]},
            {"role": "tool", "tool_call_id": call, "content": "\n".join(f"{n}.{k}: value {k * n}" for k in range(150))}]
        for resend in (False, True):
            fake.script_message({"role": "assistant", "content": f"round {n}"})
            with gateway.client(TENANT_KEY) as http:
                answer = http.post("/v1/chat/completions",
                                   json={"model": "fake", "messages": messages, "stream": stream})
            assert answer.status_code == 200, answer.text
            assert f"round {n}" in answer.text
            assert not resend or len(messages) < MIN_MESSAGES or splices[-1]
    assert sum(splices) >= 30
    forwarded = fake.last_body()["messages"]
    policy = request.node.callspec.params["gateway"]
    if policy == "coding-agent":
        assert any("artifact:" in str(m.get("content")) or "art_" in str(m.get("content")) for m in forwarded[2:-10])
    if policy == "passthrough":
        assert forwarded == messages
    held = [layout for known in layouts._parsed.values() for layout in known]
    assert held
    for layout in held:
        assert list(layout.messages) == orjson.loads(layout.raw)["messages"]
