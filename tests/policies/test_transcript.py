from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.protocol import orphan_tool_messages
from policies.tool_status import tool_result_status
from policies.transcript import (answer_fingerprint, canonical_message, conversation_id_for, first_user_node,
                                 label_conversation_id, message_path, node_id, opening_answer, tool_result_bytes,
                                 user_text)


def test_node_ids_chain_over_tenant_parent_and_message() -> None:
    m = {"role": "user", "content": "hi"}
    assert node_id("a", None, m) == node_id("a", None, dict(m))
    assert node_id("a", None, m) != node_id("b", None, m)
    assert node_id("a", "p1", m) != node_id("a", "p2", m)
    path = message_path("a", [m, {"role": "assistant", "content": "yo"}])
    assert path[1].parent_id == path[0].id and path[1].position == 1


def test_reserialised_history_keeps_its_identity() -> None:
    sent = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    echoed = {"role": "assistant", "content": "", "refusal": None, "annotations": [], "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}, "index": 0}]}
    assert canonical_message(sent) == canonical_message(echoed)
    assert node_id("t", None, sent) == node_id("t", None, echoed)
    # but a different argument is a different message
    changed = {**sent, "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{ }"}}]}
    assert node_id("t", None, changed) != node_id("t", None, sent)


SYSTEM = {"role": "system", "content": "agent"}
HI = {"role": "user", "content": "hi"}


def test_the_opening_answer_is_the_first_assistant_message_after_the_opening() -> None:
    greeting = {"role": "assistant", "content": "How can I help?"}  # the client's own, before anyone spoke
    answer = {"role": "assistant", "content": "Hello."}
    assert opening_answer(message_path("t", [SYSTEM, HI])) is None
    assert opening_answer(message_path("t", [SYSTEM, HI, answer])) is None  # a prefill: the model continues it
    path = message_path("t", [SYSTEM, HI, answer, {"role": "user", "content": "more"}])
    assert opening_answer(path) == path[2]
    path = message_path("t", [SYSTEM, greeting, HI, answer, {"role": "user", "content": "more"}])
    assert opening_answer(path) == path[3]


def test_an_answer_is_known_however_its_client_sends_it_back() -> None:
    calls = [{"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]
    chat = {"role": "assistant", "content": None, "tool_calls": calls}
    echoed = {"role": "assistant", "content": "", "refusal": None, "tool_calls": [{**calls[0], "index": 0}]}
    assert answer_fingerprint(chat) == answer_fingerprint(echoed)
    compact = {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '{"a":1}'}}]}
    spaced = {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '{"a": 1}'}}]}
    assert answer_fingerprint(compact) == answer_fingerprint(spaced)  # a client that parsed and wrote them again
    responses = {"role": "assistant", "content": [
        {"type": "reasoning", "id": "rs_1", "encrypted_content": "x"},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello.", "annotations": []}]}]}
    replayed = {"role": "assistant", "content": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello. "}]}]}
    assert answer_fingerprint(responses) == answer_fingerprint(replayed) == answer_fingerprint(
        {"role": "assistant", "content": "Hello."})
    thinking = {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                 {"type": "text", "text": "Hello.", "citations": None}]}
    assert answer_fingerprint(thinking) == answer_fingerprint({"role": "assistant", "content": "Hello."})
    assert answer_fingerprint(chat) != answer_fingerprint({**chat, "tool_calls": [
        {**calls[0], "id": "call_2"}]})  # another call: the model's own id


def test_a_conversation_is_its_label_or_its_first_exchange() -> None:
    answered = message_path("t", [SYSTEM, HI, {"role": "assistant", "content": "Hello."},
                                  {"role": "user", "content": "more"}])
    other = message_path("t", [SYSTEM, HI, {"role": "assistant", "content": "Hi there."},
                               {"role": "user", "content": "more"}])
    later = message_path("t", [m.message for m in answered] + [{"role": "assistant", "content": "Sure."},
                                                                {"role": "user", "content": "go"}])
    assert conversation_id_for("t", None, answered, "req_1") == conversation_id_for("t", None, later, "req_2")
    assert conversation_id_for("t", None, answered, "req_1") != conversation_id_for("t", None, other, "req_1")
    assert conversation_id_for("t", None, message_path("t", [SYSTEM, HI]), "req_3") == "req_3"
    assert conversation_id_for("t", "ticket", answered, "req_1") == label_conversation_id("t", "ticket")
    assert label_conversation_id("t", "ticket") != label_conversation_id("u", "ticket")


def test_a_conversation_is_named_by_what_its_user_said_first() -> None:
    environment = {"role": "user", "content": [{"type": "input_text", "text": "<environment_context>\n <cwd>/w</cwd>\n"
                                                                             "</environment_context>"}]}
    asked = {"role": "user", "content": [{"type": "input_text", "text": "Run  the\ntests."}]}
    path = message_path("t", [SYSTEM, {"role": "developer", "content": "rules"}, environment, asked])
    assert first_user_node(path) == path[3] and user_text(path[3].message) == "Run the tests."
    only_context = message_path("t", [SYSTEM, environment])
    assert first_user_node(only_context) == only_context[1]  # nothing else said: the context it is
    assert user_text(environment) == "<environment_context> <cwd>/w</cwd> </environment_context>"
    reminded = {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                            {"type": "image", "source": {}}, {"type": "text", "text": "Fix a.py"}]}
    assert user_text(reminded) == "Fix a.py" and first_user_node(message_path("t", [reminded])) is not None


def test_tool_result_bytes_are_exact_for_text() -> None:
    text = "  spaced \r\n tabs\t ünï ✓\x00"
    assert tool_result_bytes(text) == (text.encode(), "text/plain; charset=utf-8")
    assert tool_result_bytes(None)[0] == b""


def test_orphan_tool_messages() -> None:
    call = {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}},
                                                {"id": "b", "function": {"name": "f", "arguments": "{}"}}]}
    ok = [{"role": "user", "content": "x"}, call, {"role": "tool", "tool_call_id": "a", "content": "1"},
          {"role": "tool", "tool_call_id": "b", "content": "2"}]
    assert orphan_tool_messages(ok) == []
    assert orphan_tool_messages([{"role": "tool", "tool_call_id": "a"}])[0][0] == 0
    wrong_id = ok[:2] + [{"role": "tool", "tool_call_id": "zzz", "content": "1"}]
    assert "answers no call" in orphan_tool_messages(wrong_id)[0][1]
    twice = ok + [{"role": "tool", "tool_call_id": "a", "content": "again"}]
    assert "answered twice" in orphan_tool_messages(twice)[0][1]
    after_user = ok + [{"role": "user", "content": "?"}, {"role": "tool", "tool_call_id": "a"}]
    assert orphan_tool_messages(after_user)[0][0] == 5


def test_tool_result_status() -> None:
    assert tool_result_status("Error: file not found") == "error"
    assert tool_result_status("Traceback (most recent call last):\n ...") == "error"
    assert tool_result_status("ValueError: bad") == "error"
    assert tool_result_status('{"error": "denied"}') == "error"
    assert tool_result_status('{"error": null, "rows": 3}') == "ok"
    assert tool_result_status("3 files changed, no errors") == "ok"


_ROLE_MESSAGES = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.just("assistant"),
                           "tool_calls": st.lists(st.fixed_dictionaries({"id": st.sampled_from(["a", "b", "c"])}),
                                                  max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": st.sampled_from(["a", "b", "c", "d"])}),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system"])})), max_size=12)


@given(_ROLE_MESSAGES, st.integers(0, 14))
@settings(max_examples=500, deadline=None)
def test_orphans_after_a_checked_prefix_are_those_of_the_whole(messages: list[dict], checked: int) -> None:
    """Where the first `checked` messages have no orphan as a transcript of their own, starting the walk
    after them finds what the walk over the whole finds."""
    if orphan_tool_messages(messages[:checked]) == []:
        assert orphan_tool_messages(messages, checked) == orphan_tool_messages(messages)
