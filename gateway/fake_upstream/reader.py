"""Reader mode: a fake model whose answers depend only on what it can see in the request.

It stands in for a model that needs facts from files, so that a test (or `gateway evaluate`) can tell
whether a policy's projection hid something the model needed. The task is the first user message's
directive lines:

    READ notes/a.txt        one per file to read with the reading tool (`read_file`, {"path": ...})
    NEED CODE               one per fact to report

Each round, while a READ path has not been called yet in the transcript, it calls the reading tool for
the next one (one call per round). Once every file is read it looks, for each NEED name, for a line
`NAME: value` (or `NAME=value`) in the tool results as the request carries them, memories included:

- every fact visible: the final answer `FACTS: CODE=value, OTHER=value`;
- a fact missing: the earliest tool result that is a gateway memory (it names `artifact:art_...`,
  policies/memories.py) and was not brought back is brought back: with the gateway's rehydration tool
  when the request offers it (`gateway_rehydrate`, gateway/pipeline/rehydration.py), else by calling the
  original call again with the same name and arguments (a repeated call: the sign of something the
  model could not see). A memory counts as brought back once the transcript holds a rehydration of its
  artifact or its call made another time (so a re-read that comes back compacted too is not read a
  third time). With `all_at_once`, every memory not brought back is asked of the rehydration tool in
  one call (`{"artifacts": [{"artifact_id": ...}, ...]}`); by default one a round;
- nothing left to bring back: the answer with `NAME=unknown` for what is still missing.

Deterministic: the same request gives the same answer (call ids are derived from the transcript). One
reading of the transcript serves every format the fake speaks (Chat Completions, Messages, Responses,
Gemini), as agent mode's does (gateway/fake_upstream/agent.py).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from gateway.fake_upstream.state import FakeState, Step

_READ = re.compile(r"^\s*READ\s+(\S+)\s*$", re.M)
_NEED = re.compile(r"^\s*NEED\s+(\w+)\s*$", re.M)
_MEMORY = re.compile(r"artifact:(art_[0-9a-f]+)")


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Result:
    call_id: str
    text: str


@dataclass
class Seen:
    """A request as the reader sees it: the task, the tools offered, the calls and results in order."""

    task: str = ""
    offered: set[str] = field(default_factory=set)
    events: list[Call | Result] = field(default_factory=list)


def fact_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"\b{re.escape(name)}\s*[:=]\s*(\S+)")


def visible_facts(texts: list[str], names: list[str]) -> dict[str, str]:
    """The value of each name a line of `texts` gives (the first one found)."""
    found: dict[str, str] = {}
    for name in names:
        pattern = fact_pattern(name)
        for text in texts:
            if match := pattern.search(text):
                found[name] = match.group(1).rstrip(",;")
                break
    return found


@dataclass(frozen=True)
class Reader:
    tool: str = "read_file"
    argument: str = "path"
    rehydrate_tool: str = "gateway_rehydrate"
    all_at_once: bool = False  # ask the rehydration tool for every memory it needs in one call

    def step(self, seen: Seen, call_prefix: str = "call_") -> Step:
        paths = _READ.findall(seen.task)
        names = list(dict.fromkeys(_NEED.findall(seen.task)))
        calls = [e for e in seen.events if isinstance(e, Call)]
        read = {str(c.arguments.get(self.argument)) for c in calls if c.name == self.tool}
        unread = [p for p in paths if p not in read]
        if unread:
            return self._call(seen, call_prefix, self.tool, {self.argument: unread[0]})
        results = [e for e in seen.events if isinstance(e, Result)]
        facts = visible_facts([r.text for r in results], names)
        if len(facts) == len(names):
            return _answer(names, facts)
        again = self._bring_back(seen)
        if again is not None:
            return self._call(seen, call_prefix, *again)
        return _answer(names, facts)

    def _bring_back(self, seen: Seen) -> tuple[str, dict[str, Any]] | None:
        """The call that brings back the earliest memory not brought back since, or with `all_at_once` (and
        the rehydration tool offered) every one of them (None: there is none)."""
        calls = [e for e in seen.events if isinstance(e, Call)]
        by_id = {c.id: c for c in calls}
        rehydrated = {a for c in calls if c.name == self.rehydrate_tool for a in _asked_ids(c.arguments)}
        wanted: list[str] = []
        for event in seen.events:
            if not isinstance(event, Result) or not (match := _MEMORY.search(event.text)):
                continue
            original = by_id.get(event.call_id)
            if match.group(1) in rehydrated:
                continue
            if original is not None and any(_same(c, original) for c in calls if c is not original):
                continue
            if self.rehydrate_tool in seen.offered:
                if not self.all_at_once:
                    return self.rehydrate_tool, {"artifact_id": match.group(1)}
                wanted.append(match.group(1))
            elif original is not None and original.name != self.rehydrate_tool:
                return original.name, dict(original.arguments)
        if wanted:
            return self.rehydrate_tool, {"artifacts": [{"artifact_id": a} for a in dict.fromkeys(wanted)]}
        return None

    def _call(self, seen: Seen, prefix: str, name: str, arguments: dict[str, Any]) -> Step:
        digest = hashlib.sha256(json.dumps([seen.task, len(seen.events), name, arguments], sort_keys=True,
                                           default=str).encode()).hexdigest()[:20]
        call = {"id": f"{prefix}{digest}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}
        return Step(message={"role": "assistant", "content": None, "tool_calls": [call]})

    def drive(self, state: FakeState) -> None:
        """Answer every unscripted request of `state`, in each format, as this reader."""
        state.chat_responder = lambda body: self.step(chat_seen(body))
        state.responses_responder = lambda body: self.step(responses_seen(body))
        state.responder = lambda body: self.step(messages_seen(body), "toolu_")
        state.gemini_responder = lambda body: self.step(gemini_seen(body))


def _asked_ids(arguments: dict[str, Any]) -> set[str]:
    """The artifact ids a rehydration call asked for, in either form."""
    asked = [arguments.get("artifact_id")]
    items = arguments.get("artifacts")
    for item in items if isinstance(items, list) else []:
        asked.append(item.get("artifact_id") if isinstance(item, dict) else item)
    return {str(a).removeprefix("artifact:") for a in asked if a}


def _same(call: Call, original: Call) -> bool:
    return call.name == original.name and call.arguments == original.arguments


def _answer(names: list[str], facts: dict[str, str]) -> Step:
    said = ", ".join(f"{name}={facts.get(name, 'unknown')}" for name in names) or "(none)"
    return Step(message={"role": "assistant", "content": f"FACTS: {said}"})


def text_of(value: Any) -> str:
    """The text of a message's content or a tool result, whatever its shape: strings, parts, blocks,
    objects (their string leaves, one a line)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(text_of(part) for part in value)
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return value["text"]
        return "\n".join(text_of(item) for item in value.values())
    return "" if value is None else str(value)


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except ValueError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_raw": value}


def _first_task(seen: Seen, text: str) -> None:
    if not seen.task:
        seen.task = text


def chat_seen(body: dict[str, Any]) -> Seen:
    seen = Seen(offered={t["function"].get("name") for t in body.get("tools") or []
                         if isinstance(t, dict) and isinstance(t.get("function"), dict)})
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "user":
            _first_task(seen, text_of(message.get("content")))
        elif role == "assistant":
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                seen.events.append(Call(str(call.get("id")), str(function.get("name")),
                                        _arguments(function.get("arguments"))))
        elif role == "tool":
            seen.events.append(Result(str(message.get("tool_call_id")), text_of(message.get("content"))))
    return seen


def messages_seen(body: dict[str, Any]) -> Seen:
    """Tools are offered in `tools`, or added mid-conversation (a `tool_addition` block)."""
    seen = Seen(offered={t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)})
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
        for block in blocks:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "tool_addition":
                seen.offered.add(((block.get("tool") or {}).get("definition") or {}).get("name"))
            elif kind == "tool_use":
                seen.events.append(Call(str(block.get("id")), str(block.get("name")), _arguments(block.get("input"))))
            elif kind == "tool_result":
                seen.events.append(Result(str(block.get("tool_use_id")), text_of(block.get("content"))))
            elif kind == "text" and message.get("role") == "user":
                _first_task(seen, block.get("text") or "")
    return seen


def responses_seen(body: dict[str, Any]) -> Seen:
    seen = Seen(offered={t.get("name") for t in body.get("tools") or []
                         if isinstance(t, dict) and t.get("type") == "function"})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            seen.events.append(Call(str(item.get("call_id")), str(item.get("name")), _arguments(item.get("arguments"))))
        elif item.get("type") == "function_call_output":
            seen.events.append(Result(str(item.get("call_id")), text_of(item.get("output"))))
        elif item.get("role") == "user":
            _first_task(seen, text_of(item.get("content")))
    return seen


def gemini_seen(body: dict[str, Any]) -> Seen:
    """Gemini's calls carry no ids: each functionResponse answers the earliest open call of its name."""
    seen = Seen(offered={d.get("name") for t in body.get("tools") or [] if isinstance(t, dict)
                         for d in t.get("functionDeclarations") or [] if isinstance(d, dict)})
    open_calls: list[Call] = []
    for content in body.get("contents") or []:
        for part in content.get("parts") or [] if isinstance(content, dict) else []:
            if not isinstance(part, dict):
                continue
            if isinstance(call := part.get("functionCall"), dict):
                made = Call(f"gemini-{len(seen.events)}", str(call.get("name")), _arguments(call.get("args")))
                open_calls.append(made)
                seen.events.append(made)
            elif isinstance(response := part.get("functionResponse"), dict):
                answered = next((c for c in open_calls if c.name == response.get("name")), None)
                if answered is not None:
                    open_calls.remove(answered)
                seen.events.append(Result(answered.id if answered else "", text_of(response.get("response"))))
            elif isinstance(part.get("text"), str) and content.get("role", "user") == "user":
                _first_task(seen, part["text"])
    return seen
