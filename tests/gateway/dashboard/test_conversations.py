"""Which requests are one conversation, through real clients: the openai SDK (Chat Completions, streamed
and not, and the Responses API) and the anthropic SDK, each replaying the answers it got as its agent
loop does.

A conversation is its first exchange (policies.transcript.conversation_id_for): two clients that open
with the same system prompt and "hi" part at the model's answers; a client that sends its whole
transcript again on every turn stays in its conversation, its first request included (moved there
when its answer came back). The ledger, the request records and the dashboard name an unlabelled
conversation by its first user message.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import anthropic
import openai
import pytest

from testkit.gateway import TENANT_KEY, RunningGateway, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
RESULT = "\n".join(f"row {i}: the same export line every client reads" for i in range(40))


@pytest.fixture
def gateway(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    models = [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": fake.api_base,
                                                   "api_key": "sk-upstream"}},
              {"name": "claude-fake", "litellm_params": {"model": "anthropic/claude-fake", "api_base": fake.url,
                                                          "api_key": "sk-upstream"}}]
    running, server = start_gateway(settings_for(fake.api_base, storage_url, tmp_path, models=models), fake)
    yield running
    server.stop()


def sdk(gateway: RunningGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)


class ChatClient:
    """An agent loop on the openai SDK: it appends each answer to its transcript as it got it and sends
    the whole transcript every turn (streamed: the answer put together from its chunks)."""

    def __init__(self, gateway: RunningGateway, stream: bool = False) -> None:
        self.client, self.stream = sdk(gateway), stream
        self.messages: list[Any] = [SYSTEM]
        self.request_ids: list[str] = []

    def say(self, text: str) -> str:
        self.messages.append({"role": "user", "content": text})
        return self.send()

    def send(self) -> str:
        raw = self.client.chat.completions.with_raw_response.create(
            model="fake", messages=self.messages, stream=self.stream)
        self.request_ids.append(raw.headers["x-gateway-request-id"])
        if not self.stream:
            message = raw.parse().choices[0].message
            self.messages.append(message)  # the SDK's own object, as agent loops append it
            return message.content or ""
        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        for chunk in raw.parse():
            for choice in chunk.choices:
                content.append(choice.delta.content or "")
                for call in choice.delta.tool_calls or []:
                    slot = calls.setdefault(call.index, {"id": "", "type": "function",
                                                         "function": {"name": "", "arguments": ""}})
                    slot["id"] += call.id or ""
                    slot["function"]["name"] += call.function.name or ""
                    slot["function"]["arguments"] += call.function.arguments or ""
        answer: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
        if calls:
            answer["tool_calls"] = [calls[i] for i in sorted(calls)]
        self.messages.append(answer)
        return answer["content"] or ""


def records(gateway: RunningGateway, request_ids: list[str]) -> list[dict[str, Any]]:
    with gateway.client() as http:
        return [http.get(f"/api/requests/{r}").json() for r in request_ids]


def sessions(gateway: RunningGateway) -> dict[str, dict[str, Any]]:
    with gateway.client() as http:
        return {s["session"]: s for s in http.get("/api/savings").json()["by_session"]}


def test_two_clients_that_both_open_with_hi_are_two_conversations(gateway: RunningGateway) -> None:
    fake = gateway.fake
    alice, bob = ChatClient(gateway), ChatClient(gateway, stream=True)
    fake.script_message({"role": "assistant", "content": "Hello! What are we building today?"})
    fake.script_message({"role": "assistant", "content": "Hi there. How can I help?"})
    alice.say("hi")
    bob.say("hi")
    fake.script_message({"role": "assistant", "content": "A parser, then."})
    fake.script_message({"role": "assistant", "content": "Sure, the weather."})
    alice.say("a parser for TOML")
    bob.say("what is the weather like?")
    alice.send()  # sent again, as a client retries: the same transcript, the same conversation
    mine, theirs = records(gateway, alice.request_ids), records(gateway, bob.request_ids)
    assert len({r["conversation_id"] for r in mine}) == 1, "every request of alice's, her first one too"
    assert len({r["conversation_id"] for r in theirs}) == 1
    assert mine[0]["conversation_id"] != theirs[0]["conversation_id"]
    assert mine[0]["session_id"] == theirs[0]["session_id"]  # one tree: they share the opening's nodes
    assert {r["conversation_name"] for r in mine + theirs} == {"hi"}
    ledger = sessions(gateway)
    assert {key: (s["requests"], s["name"]) for key, s in ledger.items()} == {
        mine[0]["conversation_id"]: (3, "hi"), theirs[0]["conversation_id"]: (2, "hi")}


def test_each_turn_of_a_tool_loop_lands_in_its_conversation_and_a_result_is_one_artifact(
        gateway: RunningGateway) -> None:
    """The model's first answer is a call (its id is the model's own): the two clients' conversations part
    there, though both then read the same tool result, which each captures once."""
    fake = gateway.fake
    clients = [ChatClient(gateway), ChatClient(gateway, stream=True)]
    for number, client in enumerate(clients):
        fake.script_message({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_export_{number}", "type": "function", "function": {"name": "export", "arguments": "{}"}}]})
        client.say("Export the table.")
    for client in clients:
        answer = client.messages[-1]
        call_id = answer["tool_calls"][0]["id"] if isinstance(answer, dict) else answer.tool_calls[0].id
        client.messages.append({"role": "tool", "tool_call_id": call_id, "content": RESULT})
        fake.script_message({"role": "assistant", "content": "Exported 40 rows."})
        client.send()
        client.messages.append({"role": "user", "content": "Thanks."})
        client.send()
    found = [records(gateway, c.request_ids) for c in clients]
    conversations = [{r["conversation_id"] for r in runs} for runs in found]
    assert all(len(c) == 1 for c in conversations) and conversations[0] != conversations[1]
    for runs in found:  # the result was captured by the request that first carried it, and only then
        assert [len(r["captured_artifact_ids"]) for r in runs] == [0, 1, 0]
        assert runs[2]["path_artifact_ids"] == runs[1]["captured_artifact_ids"]
    assert gateway.store.count_artifacts("acme") == 2  # one per conversation: they sit on two paths


def test_clients_whose_first_answers_are_word_for_word_alike_are_one_conversation_unless_labelled(
        gateway: RunningGateway) -> None:
    """What a transcript cannot tell apart: the same opening answered word for word alike (the fake answers
    "ok"). A session label keeps them apart."""
    unlabelled = [ChatClient(gateway), ChatClient(gateway)]
    for number, client in enumerate(unlabelled):
        client.say("hi")
        client.say(f"question {number}")
    assert len({r["conversation_id"] for c in unlabelled for r in records(gateway, c.request_ids)}) == 1
    labelled = []
    for label in ("ticket-1", "ticket-2"):
        client = ChatClient(gateway)
        client.client = client.client.with_options(default_headers={"x-gateway-session": label})
        client.say("hi")
        client.say("and then?")
        labelled.append(client)
    ledger = sessions(gateway)
    assert {key: (s["requests"], s["name"]) for key, s in ledger.items() if key.startswith("ticket")} == {
        "ticket-1": (2, "ticket-1"), "ticket-2": (2, "ticket-2")}
    assert records(gateway, labelled[0].request_ids)[0]["conversation_name"] == "ticket-1"


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_client_replaying_its_output_stays_in_its_conversation(gateway: RunningGateway,
                                                                           stream: bool) -> None:
    client = sdk(gateway)
    gateway.fake.script(items=[
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque-1"},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello from responses.", "annotations": []}]}])
    items: list[Any] = [{"role": "user", "content": "hi"}]
    ids = []
    for turn in range(2):
        raw = client.responses.with_raw_response.create(model="fake", instructions="Be brief.", input=items,
                                                        stream=stream)
        ids.append(raw.headers["x-gateway-request-id"])
        if stream:
            output = next(e.response.output for e in raw.parse() if e.type == "response.completed")
        else:
            output = raw.parse().output
        # as Codex does: the output items sent back without their ids and statuses
        items += [{k: v for k, v in item.model_dump(exclude_none=True).items() if k not in ("id", "status")}
                  for item in output]
        items.append({"role": "user", "content": f"turn {turn + 2}"})
    first, second = records(gateway, ids)
    assert first["conversation_id"] == second["conversation_id"] != ids[0]
    assert first["conversation_name"] == "hi"


@pytest.mark.parametrize("stream", [False, True])
def test_an_anthropic_client_replaying_its_answers_stays_in_its_conversation(gateway: RunningGateway,
                                                                             stream: bool) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key=TENANT_KEY, max_retries=0)
    gateway.fake.script(blocks=[{"type": "text", "text": "Let me look.", "citations": None},
                                {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.py"}}],
                        stop_reason="tool_use")
    messages: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>You are in a repository.</system-reminder>"},
        {"type": "text", "text": "Fix the failing test in a.py"}]}]
    ids = []
    for turn in range(2):
        if stream:
            with client.messages.stream(model="claude-fake", max_tokens=100, messages=messages) as events:
                ids.append(events.response.headers["x-gateway-request-id"])
                answer = events.get_final_message()
        else:
            raw = client.messages.with_raw_response.create(model="claude-fake", max_tokens=100, messages=messages)
            ids.append(raw.headers["x-gateway-request-id"])
            answer = raw.parse()
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                      "content": "def test(): assert False"}]}
                        if turn == 0 else {"role": "user", "content": "and now?"})
    first, second = records(gateway, ids)
    assert first["conversation_id"] == second["conversation_id"]
    assert first["conversation_name"] == "Fix the failing test in a.py"  # the context block passed over


def test_a_long_first_message_names_its_conversation_shortened(gateway: RunningGateway) -> None:
    opening = "<b>Build</b> the \"release\" & tag it: all of it, please, and write the notes for everyone"
    client = ChatClient(gateway)
    client.say(opening)
    client.say("go on")
    run = records(gateway, client.request_ids)[0]
    name = sessions(gateway)[run["conversation_id"]]["name"]
    assert name == run["conversation_name"] and name.endswith("…") and len(name) <= 60
    assert opening.startswith(name[:-1])  # as text: the page escapes it (test_dashboard_first_run_browser.py)
