"""Agent mode of the fake upstream: the script format, the round it plays next, and whole tool loops over
each API it serves (streamed and not), driven by the real SDKs straight at the fake."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import anthropic
import openai
import pytest

from gateway.cli import main
from gateway.fake_upstream.agent import (DEFAULT_SCRIPT, AgentScript, ScriptError, Turn, chat_turn, gemini_turn,
                                         messages_turn, responses_turn)
from testkit.fake_upstream import FakeUpstream

SCRIPT = AgentScript.parse({"rounds": [{"shell": "ls"},
                                       {"tool": "read_file", "arguments": {"path": "a.txt"}, "say": "Reading."}],
                            "answer": "Done after {rounds}: {result}"})


def call_of(step: Any) -> tuple[str, dict[str, Any]]:
    (call,) = step.message["tool_calls"]
    return call["function"]["name"], json.loads(call["function"]["arguments"])


@pytest.mark.parametrize(("data", "named"), [
    ([], "an object with `rounds`"),
    ({"rounds": [], "answr": "x"}, "unknown field 'answr'; a script has `rounds` and `answer`"),
    ({"rounds": [{"shell": "ls", "args": {}}]}, "rounds[0]: unknown field 'args'"),
    ({"rounds": {"shell": "ls"}}, "rounds: a list"),
    ({"answer": 3}, "answer: text"),
    ({"rounds": ["ls"]}, "rounds[0]: an object"),
    ({"rounds": [{"shell": "ls", "tool": "Bash"}]}, "rounds[0]: give one of"),
    ({"rounds": [{"say": "hi"}]}, "rounds[0]: give one of"),
    ({"rounds": [{"shell": ["ls"]}]}, "rounds[0].shell: text"),
    ({"rounds": [{"shell": "ls"}, {"tool": "x", "arguments": []}]}, "rounds[1].arguments: an object"),
    ({"rounds": [{"shell": "ls", "arguments": {}}]}, "rounds[0].arguments: an object, with `tool`"),
])
def test_a_script_that_cannot_be_followed_is_refused_naming_the_field(data: Any, named: str) -> None:
    with pytest.raises(ScriptError, match=r"^my\.json: ") as refused:
        AgentScript.parse(data, "my.json")
    assert named in str(refused.value)


def test_a_script_file_that_does_not_read_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="missing.json"):
        AgentScript.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"rounds": [')
    with pytest.raises(ScriptError, match="bad.json"):
        AgentScript.load(tmp_path / "bad.json")


def test_rounds_play_in_order_with_the_shell_tool_offered_then_the_answer() -> None:
    offered = {"exec_command", "read_file", "view_image"}
    first = SCRIPT.step(Turn(offered, []), "call_")
    assert call_of(first) == ("exec_command", {"cmd": "ls"}) and first.message["content"] is None
    second = SCRIPT.step(Turn(offered, ["a.txt\nb.txt"]), "call_")
    assert call_of(second) == ("read_file", {"path": "a.txt"}) and second.message["content"] == "Reading."
    assert second.message["tool_calls"][0]["id"].startswith("call_")
    last = SCRIPT.step(Turn(offered, ["a.txt\nb.txt", "first line\n  last line  \n\n"]), "call_")
    assert last.message == {"role": "assistant", "content": "Done after 2: last line"}


@pytest.mark.parametrize(("tool", "arguments"), [
    ("Bash", {"command": "ls", "description": "Run ls"}),
    ("exec_command", {"cmd": "ls"}),
    ("shell_command", {"command": "ls"}),
    ("shell", {"command": ["bash", "-lc", "ls"]}),
    ("run_shell_command", {"command": "ls"}),
])
def test_a_shell_round_takes_each_agents_shell_tool_with_its_own_arguments(tool: str, arguments: Any) -> None:
    assert call_of(SCRIPT.step(Turn({tool, "Read"}, []), "toolu_")) == (tool, arguments)


def test_rounds_the_request_cannot_run_are_skipped_and_no_tools_means_the_answer() -> None:
    only_read = Turn({"read_file"}, [])
    assert call_of(SCRIPT.step(only_read, "call_"))[0] == "read_file"  # no shell tool: the shell round is skipped
    assert SCRIPT.step(Turn({"read_file"}, ["contents"]), "call_").message["content"] == "Done after 1: contents"
    assert SCRIPT.step(Turn(set(), []), "call_").message == {"role": "assistant", "content": "Done after 0: (none)"}


def test_each_format_counts_the_tool_results_since_the_latest_prompt() -> None:
    chat = {"tools": [{"type": "function", "function": {"name": "shell_command"}}], "messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "first"},
        {"role": "assistant", "tool_calls": [{"id": "c1"}]}, {"role": "tool", "tool_call_id": "c1", "content": "x"},
        {"role": "assistant", "content": "done"}, {"role": "user", "content": "again"},
        {"role": "assistant", "tool_calls": [{"id": "c2"}]},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "out"}]}]}
    assert chat_turn(chat) == Turn({"shell_command"}, ["out"])
    responses = {"tools": [{"type": "function", "name": "exec_command"}, {"type": "web_search"},
                           {"type": "custom", "name": "apply_patch"}], "input": [
        {"type": "message", "role": "developer", "content": "d"}, {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1"}, {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call", "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "2"}]}]}
    assert responses_turn(responses) == Turn({"exec_command"}, ["1", "2"])
    assert responses_turn({"input": "hello"}) == Turn(set(), [])
    messages = {"tools": [{"name": "Bash"}, {"name": "Read"}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a"},
                                     {"type": "text", "text": "<system-reminder>"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t2"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2",
                                      "content": [{"type": "text", "text": "b"}]}]}]}
    assert messages_turn(messages) == Turn({"Bash", "Read"}, ["a", "b"])  # results beside text: not a prompt
    shell_output = "<untrusted_context>\nOutput: Linux\nProcess Group PGID: 22523\n</untrusted_context>"
    gemini = {"tools": [{"functionDeclarations": [{"name": "run_shell_command"}, {"name": "read_file"}]}],
              "contents": [
                  {"role": "user", "parts": [{"text": "go"}]},
                  {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {}}}]},
                  {"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": "a"}}}]},
                  {"role": "model", "parts": [{"functionCall": {"name": "run_shell_command", "args": {}}}]},
                  {"role": "user", "parts": [{"functionResponse": {"name": "run_shell_command",
                                                                   "response": {"output": shell_output}}}]}]}
    # Gemini CLI's shell results: what the command printed, not the lines the CLI wraps it in
    assert gemini_turn(gemini) == Turn({"run_shell_command", "read_file"}, ["a", "Linux"])


@pytest.fixture
def agent_fake() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        DEFAULT_SCRIPT.drive(fake.state)
        yield fake


SHELL = {"name": "shell_command", "description": "Run a command.",
         "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_completions_loop_runs_the_three_commands_then_ends(agent_fake: FakeUpstream, stream: bool) -> None:
    client = openai.OpenAI(base_url=agent_fake.api_base, api_key="any", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "look around"}]
    commands = []
    for _ in range(5):
        if stream:
            with client.chat.completions.stream(model="m", messages=messages,
                                                tools=[{"type": "function", "function": SHELL}]) as events:
                reply = events.get_final_completion().choices[0].message
        else:
            reply = client.chat.completions.create(model="m", messages=messages,
                                                   tools=[{"type": "function", "function": SHELL}]).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            commands.append(json.loads(call.function.arguments)["command"])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"ran {commands[-1]}\nLinux"})
    assert commands == ["pwd", "ls -la", "uname -s"]
    assert reply.content == "Done (the offline fake model): 3 commands ran with your shell tool; the last printed: Linux"


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_loop_runs_the_three_commands_then_ends(agent_fake: FakeUpstream, stream: bool) -> None:
    client = openai.OpenAI(base_url=agent_fake.api_base, api_key="any", max_retries=0)
    items: list[Any] = [{"role": "user", "content": "look around"}]
    commands = []
    for _ in range(5):
        tools = [{"type": "function", **SHELL}]
        if stream:
            with client.responses.stream(model="m", input=items, tools=tools) as events:
                response = events.get_final_response()
        else:
            response = client.responses.create(model="m", input=items, tools=tools)
        calls = [i for i in response.output if i.type == "function_call"]
        items += [i.model_dump(exclude_none=True) for i in response.output]
        if not calls:
            break
        for call in calls:
            commands.append(json.loads(call.arguments)["command"])
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": "Linux"})
    assert commands == ["pwd", "ls -la", "uname -s"]
    assert response.output_text.endswith("the last printed: Linux")


@pytest.mark.parametrize("stream", [False, True])
def test_a_messages_loop_runs_the_three_commands_with_bash_then_ends(agent_fake: FakeUpstream, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=agent_fake.url, api_key="any", max_retries=0)
    tools = [{"name": "Bash", "description": "Run a command.", "input_schema": SHELL["parameters"]}]
    messages: list[Any] = [{"role": "user", "content": "look around"}]
    commands = []
    for _ in range(5):
        if stream:
            with client.messages.stream(model="claude-x", max_tokens=100, messages=messages, tools=tools) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(model="claude-x", max_tokens=100, messages=messages, tools=tools)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            break
        assert reply.stop_reason == "tool_use" and all(u.id.startswith("toolu_") for u in uses)
        commands += [u.input["command"] for u in uses]
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "Linux"}
                                                     for u in uses]})
    assert commands == ["pwd", "ls -la", "uname -s"]
    assert reply.stop_reason == "end_turn" and reply.content[0].text.endswith("the last printed: Linux")


def test_a_queued_step_goes_ahead_of_the_agent(agent_fake: FakeUpstream) -> None:
    agent_fake.script(status=429)
    client = openai.OpenAI(base_url=agent_fake.api_base, api_key="any", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content.startswith("Done (the offline fake model): 0 commands")


def test_the_command_refuses_a_bad_script_and_plain_with_a_script(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "script.json").write_text('{"rounds": [{"shell": 1}]}')
    assert main(["fake-upstream", "--script", str(tmp_path / "script.json")]) == 2
    assert "script.json: rounds[0].shell: text, not int" in capsys.readouterr().err
    assert main(["fake-upstream", "--plain", "--script", str(tmp_path / "script.json")]) == 2
    assert "--plain" in capsys.readouterr().err
