"""Workloads for the reader fake model (gateway/fake_upstream/reader.py) and the client that runs them.

`reader_workload` writes a task (READ and NEED lines) and the files it names, with each fact on the line
a test chooses: the first line or the last (which every memory keeps: policies/excerpts.py keeps a
result's opening and end), or the middle of a long file of plain lines (which a memory with a small
opening and end loses); `spread_workload` puts one fact in each of several files, followed by plain
files (so that a policy that keeps the latest rounds whole still has a memory for every fact).
`run_conversation` plays the client: it sends the conversation to a base URL (the fake, or a gateway in
front of it) as Chat Completions (testkit/reader_formats.py does it in every format, JSON or streamed),
runs the `read_file` calls it gets back from the workload's files, and loops until a final answer or
`max_rounds`. A test then reads which files were read (a path read twice is a repeated call: the model did
not see what it needed) and the answer.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

READ_TOOL = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the workspace",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
POSITIONS = ("first", "middle", "last")
NAMES = ("ALPHA", "BRAVO", "CHARLIE", "DELTA", "ECHO", "FOXTROT", "GOLF", "HOTEL")


@dataclass(frozen=True)
class Workload:
    task: str
    files: dict[str, str]
    facts: dict[str, str]  # the answer a model that saw everything gives

    @property
    def answer(self) -> str:
        return "FACTS: " + ", ".join(f"{name}={value}" for name, value in self.facts.items())


def filler(path: str, number: int) -> str:
    """A plain line: no word a memory weighs (conditions, negations, errors, identifiers)."""
    return f"line {number} of {path}: plain words about the garden, the weather and the old stone wall."


def reader_workload(files: int = 2, facts: tuple[str, ...] = ("CODE",), where: str = "middle",
                    holder: int = 0, lines: int = 60) -> Workload:
    """`files` files of `lines` lines each; every fact on line `where` (first, middle, last) of file `holder`."""
    if where not in POSITIONS:
        raise ValueError(f"where: one of {', '.join(POSITIONS)}")
    paths = [f"docs/file{n}.txt" for n in range(files)]
    values = {name: f"v{index}-{name.lower()}-q7z{index}" for index, name in enumerate(facts)}
    contents = {}
    for n, path in enumerate(paths):
        body = [filler(path, i) for i in range(1, lines + 1)]
        if n == holder:
            at = {"first": 0, "middle": lines // 2, "last": len(body)}[where]
            body[at:at] = [f"{name}: {value}" for name, value in values.items()]
        contents[path] = "\n".join(body)
    task = "\n".join(["Report the facts the files hold."] + [f"READ {p}" for p in paths]
                     + [f"NEED {name}" for name in facts])
    return Workload(task, contents, values)


def spread_workload(facts: int = 5, plain: int = 2, lines: int = 60, label: str = "") -> Workload:
    """`facts` files holding one fact each, in the middle of `lines` plain lines, then `plain` files of plain
    lines only; `label` makes the task (and so the conversation) one of its own."""
    names = list(NAMES[:facts])  # no digits: a name the task mentions is not an identifier memories keep
    values = {name: f"v{n}-{label or 'x'}-q7z{n}" for n, name in enumerate(names)}
    contents = {}
    for n in range(facts + plain):
        path = f"docs/part{n}.txt"
        body = [filler(path, i) for i in range(1, lines + 1)]
        if n < facts:
            body.insert(lines // 2, f"{names[n]}: {values[names[n]]}")
        contents[path] = "\n".join(body)
    task = "\n".join([f"Report the facts the files hold. {label}".rstrip()] + [f"READ {p}" for p in contents]
                     + [f"NEED {name}" for name in names])
    return Workload(task, contents, values)


@dataclass
class Conversation:
    messages: list[dict[str, Any]]
    reads: list[str] = field(default_factory=list)  # the paths read, in order (repeats included)
    answer: str | None = None  # the final answer's text (None: no answer within the rounds)
    responses: list[httpx.Response] = field(default_factory=list)


def run_conversation(base_url: str, workload: Workload, *, key: str = "sk-upstream", model: str = "fake",
                     max_rounds: int = 12, headers: dict[str, str] | None = None,
                     tools: list[dict[str, Any]] | None = None) -> Conversation:
    """Play the client of one conversation against `base_url` (…/v1): send, run the read calls, repeat."""
    conversation = Conversation(messages=[{"role": "system", "content": "You read files and report facts."},
                                          {"role": "user", "content": workload.task}])
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}", **(headers or {})},
                      timeout=60) as client:
        for _ in range(max_rounds):
            response = client.post("/chat/completions", json={
                "model": model, "messages": conversation.messages, "tools": tools or [READ_TOOL]})
            conversation.responses.append(response)
            response.raise_for_status()
            message = response.json()["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            conversation.messages.append({"role": "assistant", "content": message.get("content"),
                                          **({"tool_calls": calls} if calls else {})})
            if not calls:
                conversation.answer = message.get("content") or ""
                break
            for call in calls:
                conversation.messages.append({"role": "tool", "tool_call_id": call["id"],
                                              "content": _run(call, workload, conversation)})
    return conversation


def _run(call: dict[str, Any], workload: Workload, conversation: Conversation) -> str:
    function = call.get("function") or {}
    if function.get("name") != "read_file":
        return f"error: no tool {function.get('name')!r}"
    path = json.loads(function.get("arguments") or "{}").get("path")
    conversation.reads.append(path)
    return workload.files.get(path, f"error: no file {path!r}")
