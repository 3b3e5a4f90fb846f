"""The memoised message preparation (gateway/upstream/litellm_client/chat_preparation.py) builds the very request LiteLLM's
whole-list preparation builds (hypothesis).

Each example is a conversation of several requests, as agents send them: the transcript resent, grown
by a few messages, cut back and branched, and changed in place by the caller after a request was
prepared. Every request goes through `openai_request` with a memo that lives across the conversation and
without one (LiteLLM prepares every message), each on its own fresh copy of the body: the bytes of the
body (as the gateway sends them: key order included, the messages prepared before written from the
texts the memo kept), the extra headers, a refusal, and what became of the caller's own message
dicts must be the same.
"""
from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litellm.llms.openai.chat import gpt_transformation

from gateway.upstream.litellm_client.chat_preparation import MessageMemo, SentMessages, json_body
from gateway.upstream.litellm_client.direct import direct_route, openai_request
from policies.canonical import compact_json_bytes, exact_digest

ROUTE = direct_route({"model": "openai/fake", "api_base": "http://upstream.test/v1", "api_key": "sk-upstream"})
OPENAI = direct_route({"model": "gpt-4o-mini", "api_base": "https://api.openai.com/v1", "api_key": "sk-upstream"})

texts = st.sampled_from(["", "hi", "Grüße, 東京", "line one\nline two", "x" * 300])
scalars = st.one_of(st.none(), st.booleans(), st.sampled_from([0, 1, -1, 1.0, 0.0, -0.0, 2.5, 1e-07, 4.67e-05]),
                    texts)
image = st.one_of(st.just("https://example.test/a.png"), st.fixed_dictionaries(
    {"url": st.sampled_from(["https://example.test/b.png", "data:image/png;base64,AAAA"])},
    optional={"detail": st.sampled_from(["low", "high"]), "format": st.just("image/png")}))
file_part = st.fixed_dictionaries({"type": st.just("file"), "file": st.one_of(
    st.fixed_dictionaries({"file_data": st.sampled_from(["data:application/pdf;base64,JVBERi0=",
                                                         "data:text/plain;base64,aGk="])}),
    st.fixed_dictionaries({"file_id": st.sampled_from(["file-abc", "file-xyz"])},
                          optional={"format": st.sampled_from(["application/pdf", "text/plain"]),
                                    "filename": st.sampled_from(["a.pdf", "b.txt"])}))})
cache_control = st.just({"type": "ephemeral"})
parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}, optional={"cache_control": cache_control}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": image}),
    file_part,
    st.fixed_dictionaries({"type": st.just("tool_reference"), "tool_name": st.just("bash")}),
    st.fixed_dictionaries({"type": st.just("input_audio"), "input_audio": st.just({"data": "AA", "format": "wav"})}),
)
content = st.one_of(st.none(), texts, st.lists(parts, max_size=3))
call_ids = st.sampled_from(["c1", "c2", "c3", "srvtoolu_1", "srvtoolu_2"])
tool_call = st.fixed_dictionaries(
    {"id": call_ids, "function": st.fixed_dictionaries(
        {"name": st.sampled_from(["bash", "read_file", "tool_search_tool_regex", "tool_search_tool_bm25"]),
         "arguments": st.one_of(st.sampled_from(['{"command": "ls"}', "{}", ""]),
                                st.fixed_dictionaries({"command": texts}))})},
    optional={"type": st.just("function"), "index": st.just(0)})
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", None, ""])},
    optional={"content": content, "name": st.one_of(st.none(), st.just("alice")),
              "tool_calls": st.one_of(st.none(), st.lists(tool_call, max_size=2)),
              "tool_call_id": st.one_of(st.none(), call_ids), "cache_control": cache_control,
              "vendor": scalars, "function_call": st.none()})
plain = st.one_of(  # the shapes an agent sends most, so that memo hits are many
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user"]), "content": texts}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.one_of(st.none(), texts),
                           "tool_calls": st.lists(tool_call, min_size=1, max_size=1)}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": call_ids, "content": texts}))
transcripts = st.lists(st.one_of(plain, plain, message), min_size=1, max_size=8)
# What happens to the transcript before the next request: resent, grown, cut and branched, a message
# edited, or the previous request's own message objects changed in place by the caller.
steps = st.lists(st.one_of(
    st.tuples(st.just("resend")),
    st.tuples(st.just("grow"), transcripts),
    st.tuples(st.just("branch"), st.integers(0, 8), transcripts),
    st.tuples(st.sampled_from(["edit", "change"]), st.integers(0, 8), scalars),
), min_size=1, max_size=4)
requests = st.fixed_dictionaries({}, optional={
    "tools": st.just([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]),
    "temperature": st.sampled_from([0.5, 1, None]), "reasoning_effort": st.sampled_from(["low", "high"]),
    "response_format": st.just({"type": "json_object"}), "tool_choice": st.sampled_from(["auto", {"type": "auto"}]),
    "stop": st.sampled_from(["x", ["a", "b"]]), "max_tokens": st.just(64), "user": st.just("u1"),
    "thinking": st.just({"type": "enabled", "budget_tokens": 1024}),
    "web_search_options": st.just({"search_context_size": "low"}),
    "extra_body": st.sampled_from([{"vendor_knob": 1}, {"prompt_cache_options": {"mode": "implicit"}},
                                   {"prompt_cache_options": {"mode": "explicit"}}]),
    "stream_options": st.just({"include_usage": True})})


def kwargs_of(route: Any, messages: list[Any], extra: dict[str, Any]) -> dict[str, Any]:
    return {"model": f"openai/{route.model}", "messages": messages, "max_retries": 0, "api_key": route.api_key,
            "api_base": route.api_base, "extra_headers": {"x-gateway-request": "r1"}, **copy.deepcopy(extra)}


def prepared(route: Any, messages: list[Any], extra: dict[str, Any], memo: MessageMemo | None,
             by_digest: bool = False) -> Any:
    """The request `openai_request` builds (as JSON text), or the exception it raises; and the caller's dicts.
    `by_digest`: the memo knows the messages by their digests, as parsing computes them."""
    digests = [exact_digest(m) if type(m) is dict else None for m in messages] if by_digest else None
    try:
        built = openai_request(route, kwargs_of(route, messages, extra), True, memo=memo, digests=digests)
        # the bytes the gateway sends: with a memo, the kept texts of the messages it prepared before
        outcome: Any = None if built is None else (json_body(built[0]), built[1])
        if built is not None:
            assert outcome[0] == compact_json_bytes(built[0])
    except Exception as exc:
        outcome = (type(exc).__name__, str(exc))
    return outcome, json.dumps(messages)


def changed(messages: list[Any], at: int, value: Any) -> None:
    """A message's content, or its first tool call's arguments, set to `value` in place."""
    target = messages[at % len(messages)]
    calls = target.get("tool_calls")
    if isinstance(calls, list) and calls and isinstance(calls[0], dict) and isinstance(calls[0].get("function"), dict):
        calls[0]["function"]["arguments"] = json.dumps({"changed": value})
    else:
        target["content"] = value


def next_transcript(transcript: list[Any], step: tuple[Any, ...], sent: list[Any]) -> list[Any]:
    kind = step[0]
    if kind == "grow":
        return transcript + step[1]
    if kind == "branch":
        return transcript[:step[1]] + step[2]
    if kind == "edit":  # the client sends an older message changed
        edited = copy.deepcopy(transcript)
        changed(edited, step[1], step[2])
        return edited
    if kind == "change":  # the caller changes the objects of the request it sent, then resends the transcript
        changed(sent, step[1], step[2])
    return transcript


def conversation(route: Any, first: list[Any], steps: list[tuple[Any, ...]], extras: list[dict[str, Any]],
                 by_digest: bool = False) -> None:
    memo = MessageMemo()
    transcript = first
    for n, step in enumerate([("resend",), *steps]):
        extra = extras[n % len(extras)]
        with_memo = copy.deepcopy(transcript)
        assert prepared(route, with_memo, extra, memo, by_digest) == \
            prepared(route, copy.deepcopy(transcript), extra, None)
        transcript = next_transcript(transcript, step, with_memo)


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(transcripts, steps, st.lists(requests, min_size=1, max_size=3))
def test_same_request_as_litellm_whole(first: list[Any], steps: list[tuple[Any, ...]],
                                       extras: list[dict[str, Any]]) -> None:
    conversation(ROUTE, first, steps, extras)


@SETTINGS
@given(transcripts, steps, st.lists(requests, min_size=1, max_size=3))
def test_same_request_with_messages_known_by_their_digests(first: list[Any], steps: list[tuple[Any, ...]],
                                                           extras: list[dict[str, Any]]) -> None:
    """The gateway hands the memo the digests parsing computed (gateway/upstream/litellm_client/client.py's
    `_known_digests`): the same requests, as the transcript grows, branches and changes in place."""
    conversation(ROUTE, first, steps, extras, by_digest=True)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transcripts, steps, st.lists(requests, min_size=1, max_size=3))
def test_same_request_on_api_openai_com(first: list[Any], steps: list[tuple[Any, ...]],
                                        extras: list[dict[str, Any]]) -> None:
    conversation(OPENAI, first, steps, extras)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(transcripts, steps)
def test_same_request_for_a_model_without_mid_conversation_system(
        monkeypatch: pytest.MonkeyPatch, first: list[Any], steps: list[tuple[Any, ...]]) -> None:
    """Where instructions move to the front, the developer-role step looks at the whole list."""
    monkeypatch.setattr(gpt_transformation, "declared_mid_conversation_system_support", lambda *_: False)
    conversation(ROUTE, first, steps, [{}])


def test_a_resent_transcript_comes_from_the_memo() -> None:
    memo = MessageMemo()
    transcript = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    for _ in range(2):
        first = memo.lookup(ROUTE, copy.deepcopy(transcript), {"custom_llm_provider": "openai"})
        assert first is not None
        first.body(lambda some: {"messages": some}, None)
    again = memo.lookup(ROUTE, copy.deepcopy(transcript), {"custom_llm_provider": "openai"})
    assert again is not None and again._before_new == [] and len(again.messages) == 4


@pytest.mark.parametrize("transcript", [
    [{"role": "user", "content": [{"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0="}}]}],
    [{"role": "assistant", "tool_calls": [{"id": "srvtoolu_1", "function": {"name": "tool_search_tool_regex",
                                                                            "arguments": "{}"}}]}],
    [{"role": "tool", "tool_call_id": "c1", "content": [{"type": "image_url", "image_url": {"url": "https://x/a"}}]}],
    [{"role": "user", "content": "hi", "when": object()}],
    [{"role": "user", "content": "hi", 1: "one"}],
], ids=["pdf part", "tool-search call", "image in a tool message", "an object", "an int key"])
def test_left_to_litellm_whole(transcript: list[Any]) -> None:
    assert MessageMemo().lookup(ROUTE, transcript, {"custom_llm_provider": "openai"}) is None


def test_a_message_known_by_its_digest_comes_from_the_memo() -> None:
    memo = MessageMemo()
    transcript = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    digests = [exact_digest(m) for m in transcript]
    for _ in range(2):
        found = memo.lookup(ROUTE, copy.deepcopy(transcript), {"custom_llm_provider": "openai"}, digests)
        assert found is not None
        found.body(lambda some: {"messages": some}, None)
    assert found._before_new == []
    # Known by the digest only: the same messages without it are prepared again (and then remembered).
    fresh = memo.lookup(ROUTE, copy.deepcopy(transcript), {"custom_llm_provider": "openai"})
    assert fresh is not None and len(fresh._before_new) == 2


def test_the_memo_holds_a_bounded_share_of_text() -> None:
    """Large verbatim results are forgotten oldest first once the memo holds `max_chars` of text; a
    message larger than all of it is not kept; what stays still comes from the memo."""
    memo = MessageMemo(max_chars=45_000)  # an entry of these: ~10 kB of text and a key as long

    def send(transcript: list[Any]) -> Any:
        found = memo.lookup(ROUTE, copy.deepcopy(transcript), {"custom_llm_provider": "openai"})
        assert found is not None
        found.body(lambda some: {"messages": some}, None)
        return found

    big = [{"role": "user", "content": f"{n} " + "x" * 10_000} for n in range(4)]
    send(big)
    assert memo.chars <= 45_000 and len(memo._prepared) == 2  # the two latest
    assert len(send(big[2:])._before_new) == 0  # those come from the memo
    send([{"role": "user", "content": "y" * 30_000}])
    assert memo.chars <= 45_000 and len(memo._prepared) == 2
    memo.clear()
    assert memo.chars == 0 and memo._weights == {}


def test_a_message_past_the_largest_is_prepared_anew_each_time() -> None:
    """The memo keeps no message of more than `largest` characters (the others still come from it), and
    what is sent is the same either way."""
    memo = MessageMemo(largest=20_000)
    transcript = [{"role": "user", "content": "short"}, {"role": "user", "content": "x" * 30_000}]
    sent = []
    for _ in range(2):
        found = memo.lookup(ROUTE, copy.deepcopy(transcript), {"custom_llm_provider": "openai"})
        assert found is not None
        sent.append(found.body(lambda some: {"messages": some}, None))
    assert len(found._before_new) == 1 and len(memo._prepared) == 1  # the short one came from the memo
    assert sent[0] == sent[1] and memo.chars < 20_000


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=6), json_values, max_size=4), max_size=6),
       st.dictionaries(st.sampled_from(["model", "tools", "stream", "temperature"]), json_values, max_size=3),
       st.sampled_from(["as made", "serialised before", "appended", "replaced", "removed"]), st.integers(0, 3))
def test_a_body_of_kept_message_texts_is_the_bytes_of_the_whole(messages: list[Any], fields: dict[str, Any],
                                                                 change: str, place: int) -> None:
    """`json_body` writes the messages from their kept texts, and whatever the values (floats Python writes
    otherwise than orjson, integers past 64 bits, lone surrogates) or what became of the list after it was
    made, wherever the messages are among the body's fields, the bytes are those of the whole body serialised
    at once."""
    sent = SentMessages(messages, [[None] for _ in messages])
    items = list(fields.items())
    items.insert(min(place, len(items)), ("messages", sent))  # first, last or between the other fields
    body = dict(items)
    if change == "serialised before":
        json_body(body)
    elif change == "appended":
        sent.append({"role": "user", "content": "more"})
    elif change == "replaced" and sent:
        sent[0] = {"role": "user", "content": "other"}
    elif change == "removed" and sent:
        sent.pop()
    try:
        expected = compact_json_bytes(body)
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)):
            json_body(body)
        return
    assert json_body(body) == expected
