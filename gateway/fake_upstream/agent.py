"""Agent mode: the fake upstream plays a model that runs the client's tools for a few rounds, then answers.

A script (JSON, `gateway fake-upstream --script FILE`) lists the tool rounds and the final answer:

    {"rounds": [{"shell": "ls"},
                {"tool": "read_file", "arguments": {"path": "README.md"}, "say": "Reading the README."}],
     "answer": "Done after {rounds} tool rounds. Last result: {result}"}

- `{"shell": COMMAND}` runs a command line with whichever shell tool the request offers (`SHELL_TOOLS`:
  Claude Code's `Bash`, Codex CLI's `exec_command`, `shell_command` or `shell`, Gemini CLI's
  `run_shell_command`), with that tool's own arguments.
- `{"tool": NAME, "arguments": {...}}` calls a function tool by its name.
- `say` (optional) is text the model writes before the call.

A round whose tool the request does not offer is skipped, so one script serves every client, and a request
that offers no tools at all (a title or a summary a client asks for on the side) gets the answer at once.
Which round comes next is the number of tool results since the latest user prompt (a user message that is
not only tool results): each new prompt starts the rounds over. `{result}` in the answer is the last line of
the latest tool result (at most 200 characters), `{rounds}` the number of tool results since the prompt.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gateway.fake_upstream.state import FakeState, Step

# The shell tools of the agents we know, by name, and the arguments each takes for one command line.
SHELL_TOOLS: dict[str, Callable[[str], dict[str, Any]]] = {
    "Bash": lambda command: {"command": command, "description": f"Run {command}"},  # Claude Code
    "exec_command": lambda command: {"cmd": command},  # Codex CLI
    "shell_command": lambda command: {"command": command},  # Codex CLI (some models)
    "shell": lambda command: {"command": ["bash", "-lc", command]},  # Codex CLI (earlier versions)
    "run_shell_command": lambda command: {"command": command},  # Gemini CLI
}
RESULT_CHARS = 200


class ScriptError(ValueError):
    """A script that cannot be followed; the message names the field."""


@dataclass(frozen=True)
class Round:
    shell: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    say: str | None = None

    def call(self, offered: set[str]) -> tuple[str, dict[str, Any]] | None:
        """The tool and arguments for this round among the tools offered (None: the round is skipped)."""
        if self.shell is not None:
            name = next((name for name in SHELL_TOOLS if name in offered), None)
            return None if name is None else (name, SHELL_TOOLS[name](self.shell))
        return (self.tool, dict(self.arguments or {})) if self.tool in offered else None


@dataclass(frozen=True)
class Turn:
    """What a request shows of the current turn: the tools offered, the tool results since the prompt."""

    offered: set[str]
    results: list[str]


@dataclass(frozen=True)
class AgentScript:
    rounds: tuple[Round, ...]
    answer: str

    @classmethod
    def parse(cls, data: Any, source: str = "script") -> "AgentScript":
        if not isinstance(data, dict):
            raise ScriptError(f"{source}: an object with `rounds` (a list) and `answer` (text)")
        if unknown := sorted(set(data) - {"rounds", "answer"}):
            raise ScriptError(f"{source}: unknown field {', '.join(map(repr, unknown))}; a script has `rounds` "
                              f"and `answer`")
        answer = data.get("answer", "Done.")
        if not isinstance(answer, str):
            raise ScriptError(f"{source}: answer: text, not {type(answer).__name__}")
        rounds = data.get("rounds", [])
        if not isinstance(rounds, list):
            raise ScriptError(f"{source}: rounds: a list of rounds")
        return cls(tuple(_round(item, f"{source}: rounds[{index}]") for index, item in enumerate(rounds)), answer)

    @classmethod
    def load(cls, path: str | Path) -> "AgentScript":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ScriptError(f"{path}: {error}") from None
        return cls.parse(data, str(path))

    def step(self, turn: Turn, call_prefix: str) -> Step:
        """The model's next answer: the next round's tool call, or the final answer once none is left."""
        playable = [(r.say, call) for r in self.rounds if (call := r.call(turn.offered)) is not None]
        done = len(turn.results)
        if done < len(playable):
            say, (name, arguments) = playable[done]
            tool_call = {"id": f"{call_prefix}{uuid.uuid4().hex[:20]}", "type": "function",
                         "function": {"name": name, "arguments": json.dumps(arguments)}}
            return Step(message={"role": "assistant", "content": say, "tool_calls": [tool_call]})
        lines = [line.strip() for line in turn.results[-1].splitlines() if line.strip()] if turn.results else []
        latest = lines[-1][:RESULT_CHARS] if lines else "(none)"
        text = self.answer.replace("{result}", latest).replace("{rounds}", str(done))
        return Step(message={"role": "assistant", "content": text})

    def drive(self, state: FakeState) -> None:
        """Answer every unscripted request of `state`, in each format, by this script."""
        state.chat_responder = lambda body: self.step(chat_turn(body), "call_")
        state.responses_responder = lambda body: self.step(responses_turn(body), "call_")
        state.responder = lambda body: self.step(messages_turn(body), "toolu_")
        state.gemini_responder = lambda body: self.step(gemini_turn(body), "call_")


def _round(item: Any, where: str) -> Round:
    if not isinstance(item, dict):
        raise ScriptError(f"{where}: an object with `shell` or `tool` (and `arguments`, `say`)")
    if unknown := sorted(set(item) - {"shell", "tool", "arguments", "say"}):
        raise ScriptError(f"{where}: unknown field {', '.join(map(repr, unknown))}; a round has `shell` or `tool` "
                          f"(and `arguments`, `say`)")
    if ("shell" in item) == ("tool" in item):
        raise ScriptError(f"{where}: give one of `shell` (a command line) or `tool` (a tool name)")
    for key in ("shell", "tool", "say"):
        if key in item and not isinstance(item[key], str):
            raise ScriptError(f"{where}.{key}: text, not {type(item[key]).__name__}")
    if "arguments" in item and ("tool" not in item or not isinstance(item["arguments"], dict)):
        raise ScriptError(f"{where}.arguments: an object, with `tool`")
    return Round(shell=item.get("shell"), tool=item.get("tool"), arguments=item.get("arguments"), say=item.get("say"))


DEFAULT_SCRIPT = AgentScript(
    rounds=(Round(shell="pwd"), Round(shell="ls -la"), Round(shell="uname -s")),
    answer="Done (the offline fake model): {rounds} commands ran with your shell tool; the last printed: {result}")


def _text(value: Any) -> str:
    """A tool result's text, whatever its shape (a string, content parts, blocks)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text(part) for part in value)
    if isinstance(value, dict):
        return _text(value["text"]) if "text" in value else json.dumps(value)
    return "" if value is None else json.dumps(value)


def _since_prompt(entries: list[Any], is_prompt: Callable[[dict[str, Any]], bool]) -> list[Any]:
    last = max((i for i, e in enumerate(entries) if isinstance(e, dict) and is_prompt(e)), default=-1)
    return [e for e in entries[last + 1:] if isinstance(e, dict)]


def chat_turn(body: dict[str, Any]) -> Turn:
    offered = {t["function"].get("name") for t in body.get("tools") or []
               if isinstance(t, dict) and isinstance(t.get("function"), dict)}
    after = _since_prompt(body.get("messages") or [], lambda m: m.get("role") == "user")
    return Turn(offered, [_text(m.get("content")) for m in after if m.get("role") == "tool"])


RESPONSES_OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")


def responses_turn(body: dict[str, Any]) -> Turn:
    offered = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"}
    items = body.get("input")
    after = _since_prompt(items if isinstance(items, list) else [], lambda i: i.get("role") == "user")
    return Turn(offered, [_text(i.get("output")) for i in after if i.get("type") in RESPONSES_OUTPUTS])


def _tool_results(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"] \
        if isinstance(content, list) else []


def messages_turn(body: dict[str, Any]) -> Turn:
    offered = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
    after = _since_prompt(body.get("messages") or [],
                          lambda m: m.get("role") == "user" and not _tool_results(m))
    return Turn(offered, [_text(b.get("content")) for m in after for b in _tool_results(m)])


def _function_responses(content: dict[str, Any]) -> list[dict[str, Any]]:
    return [p["functionResponse"] for p in content.get("parts") or []
            if isinstance(p, dict) and isinstance(p.get("functionResponse"), dict)]


_GEMINI_SHELL_FIELDS = ("Error:", "Exit Code:", "Signal:", "Background PIDs:", "Process Group PGID:")


def _gemini_result(response: dict[str, Any]) -> str:
    """A functionResponse's text; for Gemini CLI's shell tool, what the command printed (its result reads
    `<untrusted_context>`, `Output: ...`, then `Exit Code:`, `Process Group PGID:` and such lines)."""
    result = response.get("response")
    text = _text(result.get("output", result) if isinstance(result, dict) else result)
    if response.get("name") != "run_shell_command" or "Output: " not in text:
        return text
    printed = text.split("Output: ", 1)[1].splitlines()
    end = next((i for i, line in enumerate(printed) if line.startswith(_GEMINI_SHELL_FIELDS + ("</",))), len(printed))
    return "\n".join(printed[:end])


def gemini_turn(body: dict[str, Any]) -> Turn:
    offered = {d.get("name") for t in body.get("tools") or [] if isinstance(t, dict)
               for d in t.get("functionDeclarations") or [] if isinstance(d, dict)}
    after = _since_prompt(body.get("contents") or [],
                          lambda c: c.get("role", "user") == "user" and not _function_responses(c))
    return Turn(offered, [_gemini_result(r) for c in after for r in _function_responses(c)])
