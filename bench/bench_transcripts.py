"""The transcripts bench/proxy_compare.py (and the in-process benches beside it) send: synthetic
coding-agent sessions from a seed, and the start of the OpenHands ponyc-4588 trace; `Transcript`
serialises one once and appends a tool round never seen before without serialising it again."""
from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from policies.protocol import ends_on_answered_round  # noqa: E402

TRACE = REPO / "tests" / "data" / "traces" / "openhands_codeact_llama4-maverick_ponyc-4588.jsonl"


TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command in the repository.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {"name": "read_file", "description": "Read a file, with line numbers.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "edit_file", "description": "Replace text in a file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"},
                                                     "new": {"type": "string"}}, "required": ["path", "old", "new"]}}},
]
FILES = [f"src/tinyparse/{name}.py" for name in
         ("parser", "lexer", "tokens", "ast", "errors", "config", "cli", "render", "cache", "schema")]
NAMES = ["parse_expr", "next_token", "peek", "expect", "read_config", "resolve", "emit", "validate", "flush",
         "normalize", "tokenize", "build_index", "span_of", "report_error", "load_schema"]
VARS = ["token", "node", "source", "offset", "config", "result", "stack", "span", "items", "path"]
CODE = ["def {f}({v}, {w}=None):", "    if {v} is None:", "        return {w}", "    {v} = {f}({w})",
        "    for {v} in {w}:", "        {w}.append({f}({v}))", "    raise ParseError(f\"unexpected {{{v}!r}}\")",
        "    return {v}", "", "class {F}Error(Exception):", "    \"\"\"Raised when {f} fails.\"\"\"",
        "    {v}: list[str] = field(default_factory=list)", "    assert {v}.kind != TokenKind.EOF, {w}",
        "    while {v} < len({w}):", "        {v} += 1", "    # TODO: {f} should not see {w} here",
        "import {v}", "from .{v} import {f}"]


def _code(rng: random.Random, count: int, start: int = 1) -> str:
    lines = []
    for number in range(start, start + count):
        name = rng.choice(NAMES)
        line = rng.choice(CODE).format(f=name, F=name.title().replace("_", ""), v=rng.choice(VARS), w=rng.choice(VARS))
        lines.append(f"{number:>6}\t{line}")
    return "\n".join(lines)


def _grep(rng: random.Random, name: str) -> str:
    hits = [f"{rng.choice(FILES)}:{rng.randint(1, 900)}:    {rng.choice(VARS)} = {name}({rng.choice(VARS)})"
            for _ in range(rng.randint(4, 40))]
    return "\n".join(sorted(hits))


def _pytest(rng: random.Random, name: str) -> str:
    passed, failed = rng.randint(40, 400), rng.randint(0, 3)
    out = ["============================= test session starts ==============================",
           "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0", "rootdir: /workspace/tinyparse",
           f"collected {passed + failed} items", ""]
    for module in rng.sample(FILES, 4):
        test = module.replace("src/tinyparse/", "tests/test_")
        out.append(f"{test} {'.' * rng.randint(10, 60)}{'F' if failed else ''} [{rng.randint(5, 100):>3}%]")
    for _ in range(failed):
        out += ["", f"___________________________ test_{name}_{rng.choice(VARS)} ___________________________", "",
                _code(rng, rng.randint(4, 12), rng.randint(10, 300)),
                f">       assert {rng.choice(VARS)} == {rng.choice(VARS)}",
                f"E       AssertionError: assert <Token {rng.randint(1, 99)}> == <Token {rng.randint(1, 99)}>", ""]
    summary = f"{failed} failed, {passed} passed" if failed else f"{passed} passed"
    out.append(f"========================= {summary} in {rng.uniform(0.5, 9):.2f}s =========================")
    return "\n".join(out)


def _diff(rng: random.Random, path: str) -> str:
    out = [f"diff --git a/{path} b/{path}", f"index {rng.getrandbits(28):07x}..{rng.getrandbits(28):07x} 100644",
           f"--- a/{path}", f"+++ b/{path}"]
    for _ in range(rng.randint(1, 4)):
        out.append(f"@@ -{rng.randint(1, 500)},7 +{rng.randint(1, 500)},8 @@")
        out += [f"{rng.choice(' -+')}{line.split(chr(9), 1)[1]}" for line in _code(rng, 8).splitlines()]
    return "\n".join(out)


def _round(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """One assistant tool call and its result, a coding agent's typical step."""
    path, name = rng.choice(FILES), rng.choice(NAMES)
    kind = rng.choices(["read", "grep", "pytest", "edit", "git"], [35, 20, 20, 15, 10])[0]
    if kind == "read":
        tool, arguments, output = "read_file", {"path": path}, _code(rng, rng.randint(15, 110))
        thought = f"Let me read {path} to see how {name} handles this."
    elif kind == "grep":
        tool, arguments, output = "bash", {"command": f"grep -rn '{name}(' src/"}, _grep(rng, name)
        thought = f"Where else is {name} called?"
    elif kind == "pytest":
        tool, arguments = "bash", {"command": f"python -m pytest -x -q tests/ -k {name}"}
        output, thought = _pytest(rng, name), "Running the tests again."
    elif kind == "edit":
        old = _code(rng, 2).split("\t", 1)[1]
        tool, arguments = "edit_file", {"path": path, "old": old, "new": old.replace("return", "return None or")}
        output = (f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet:\n"
                  f"{_code(rng, rng.randint(8, 30), rng.randint(1, 400))}\nReview the changes and make sure they are "
                  "as expected. Edit the file again if necessary.")
        thought = f"I'll fix {name} in {path} so it stops at the end of input."
    else:
        tool, arguments, output = "bash", {"command": f"git diff {path}"}, _diff(rng, path)
        thought = "Let me check the diff so far."
    call_id = f"call_{n:04d}"
    return [{"role": "assistant", "content": thought, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}]},
            {"role": "tool", "tool_call_id": call_id, "content": output}]


def synthetic_session(messages: int, seed: int) -> list[dict[str, Any]]:
    """system, user, then (messages - 2) / 2 tool rounds; the same messages for the same seed."""
    rng = random.Random(seed)
    session = [{"role": "system", "content": "You are a careful coding agent working in /workspace/tinyparse. "
                "Use the tools to inspect files and run commands; make minimal changes; run the tests. " * 12},
               {"role": "user", "content": "test_parser.py::test_nested_brackets fails with an AssertionError "
                "since the last release. Find the cause, fix it and make sure the whole suite passes."}]
    for n in range(1, (messages - 2) // 2 + 1):
        session += _round(rng, n)
    return session


def trace_session(limit: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first `limit` messages of TRACE, cut back to end on an answered tool round; and its tools."""
    trace = json.loads(TRACE.read_text(encoding="utf-8").splitlines()[0])
    cut = list(trace["messages"][:limit])
    while cut and not ends_on_answered_round(cut):
        cut.pop()
    return cut, trace.get("tools") or TOOLS


@dataclass
class Transcript:
    """A transcript serialised once; `body(n)` appends tool round n (never seen) without re-serialising."""

    name: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    stream: bool
    head: bytes = b""
    templates: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        body: dict[str, Any] = {"model": "fake", "tools": self.tools}
        if self.stream:
            body["stream"] = True
        body["messages"] = self.messages  # last, so its closing `]}` ends the bytes
        self.head = json.dumps(body).encode()
        self.templates = [(call, result) for call, result in zip(self.messages, self.messages[1:])
                          if call.get("role") == "assistant" and len(call.get("tool_calls") or []) == 1
                          and result.get("role") == "tool" and 300 <= len(result.get("content") or "") <= 3000]

    def body(self, round_number: int | None = None) -> bytes:
        if round_number is None:
            return self.head
        call, result = self.templates[round_number % len(self.templates)]
        call_id = f"call_bench_{round_number:06d}"
        extra = [{**call, "tool_calls": [{**call["tool_calls"][0], "id": call_id}]},
                 {**result, "tool_call_id": call_id, "content": f"{result['content']}\n[bench round {round_number}]"}]
        return self.head[:-2] + b", " + json.dumps(extra).encode()[1:-1] + b"]}"


def build_transcripts(args: argparse.Namespace) -> list[Transcript]:
    trace_messages, trace_tools = trace_session(99)
    every = {
        "synthetic-100": lambda: Transcript("synthetic-100", synthetic_session(100, args.seed), TOOLS, args.stream),
        "synthetic-1000": lambda: Transcript("synthetic-1000", synthetic_session(1000, args.seed), TOOLS, args.stream),
        f"trace-{len(trace_messages)}": lambda: Transcript(f"trace-{len(trace_messages)}", trace_messages,
                                                           trace_tools, args.stream),
    }
    wanted = ["synthetic-100"] if args.quick and not args.transcripts else args.transcripts or list(every)
    unknown = [name for name in wanted if name not in every]
    if unknown:
        raise SystemExit(f"unknown transcript(s) {unknown}; choose from {list(every)}")
    return [every[name]() for name in wanted]


def alternating_sender(client: Any, transcript: Transcript) -> Callable[[int], None]:
    """`send(number)`: request `number` of a sequential run, the transcript alone for even numbers and
    with a new tool round for odd ones (as bench/proxy_compare.py loads), posted with the httpx `client`;
    anything but a 200 ends the run with the gateway's words."""
    rounds = itertools.count(1)

    def send(number: int) -> None:
        response = client.post("/chat/completions", content=transcript.body(next(rounds) if number % 2 else None))
        if response.status_code != 200:
            raise SystemExit(f"HTTP {response.status_code}: {response.text[:300]}")

    return send
