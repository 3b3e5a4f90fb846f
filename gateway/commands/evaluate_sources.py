"""The conversations `gateway evaluate` replays: trace files, and conversations a gateway stored.

A source is a transcript (Chat Completions messages), the turns to ask at (the indexes i whose request
is messages[:i]; messages[i], when there is one, is the next message that was recorded) and the tools
to offer. A trace file is read as `gateway replay` reads it (every assistant message after the first
message is a turn). A stored conversation is its latest run's transcript, read from the configured
store through the records' own reads (`recent_runs`, `path_messages`), with that run's answer as the
last message when it was a Chat Completions or Messages answer; without one, the run's request is the
last turn and has nothing recorded to compare with.

A transcript that calls tools but declares none gets a declaration per name it calls (any arguments):
providers refuse tool calls in a conversation that offers no tools, and the gateway offers its
rehydration tool only to a request that has tools.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from gateway.app import build_store
from gateway.commands.evaluate_gateway import EvaluateError
from gateway.commands.replay import TraceError, load_trace, trace_turns, wire_message
from gateway.config import Settings

_SCANNED_RUNS = 2000  # the latest runs read to find a tenant's latest conversations


@dataclass(frozen=True)
class Source:
    name: str
    messages: list[dict[str, Any]]
    turns: list[int]
    tools: list[dict[str, Any]] | None = field(default=None)

    def recorded(self, index: int) -> dict[str, Any] | None:
        return self.messages[index] if index < len(self.messages) else None


def declared_tools(messages: list[dict[str, Any]], tools: Any) -> list[dict[str, Any]] | None:
    """The transcript's tools, or a declaration for each tool name it calls when it declares none."""
    if isinstance(tools, list) and tools:
        return tools
    names = dict.fromkeys(call["function"]["name"] for m in messages for call in m.get("tool_calls") or []
                          if isinstance(call, dict) and isinstance(call.get("function"), dict)
                          and call["function"].get("name"))
    return [{"type": "function", "function": {
        "name": name, "description": f"The transcript's {name} tool.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": True}}} for name in names] or None


def trace_source(path: str) -> Source:
    try:
        trace = load_trace(path)
    except TraceError as error:
        raise EvaluateError(f"trace {error}") from None
    messages, turns = trace_turns(trace)
    return Source(Path(path).name, messages, turns, declared_tools(messages, trace.get("tools")))


def stored_sources(settings: Settings, tenant: str, conversation: str | None, limit: int) -> list[Source]:
    """The latest run of each of `tenant`'s latest `limit` conversations (or of `conversation`: its id or
    session label), newest first."""
    store = build_store(settings)
    try:
        runs = store.recent_runs(tenant, limit=1 if conversation else _SCANNED_RUNS, session_key=conversation)
        latest: dict[str, dict[str, Any]] = {}
        for run in runs:
            key = run.get("session_label") or run.get("conversation_id") or run["tree_id"]
            latest.setdefault(key, run)
            if len(latest) >= limit:
                break
        sources = [_stored_source(key, run, store.path_messages(run["leaf_node_id"])) for key, run in latest.items()]
    finally:
        store.engine.dispose()
    if not sources:
        which = f"conversation {conversation!r}" if conversation else "conversations"
        raise EvaluateError(f"tenant {tenant!r} has no stored {which} in {settings.storage_url()}")
    return sources


def _stored_source(key: str, run: Mapping[str, Any], path: list[dict[str, Any]]) -> Source:
    messages = [wire_message(m) for m in path]
    answer = recorded_answer(run.get("response"))
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i > 0]
    if answer is not None:
        messages.append(answer)
    turns.append(len(path))  # the run's own request: its answer, when kept, is the recorded next message
    return Source(f"{key} (run {run['id']})", messages, turns, declared_tools(messages, None))


def recorded_answer(response: Any) -> dict[str, Any] | None:
    """A run's answer as an assistant message: a Chat Completions body's, or a Messages body's blocks."""
    if not isinstance(response, dict):
        return None
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
            and isinstance(choices[0].get("message"), dict):
        return wire_message({**choices[0]["message"], "role": "assistant"})
    blocks = response.get("content")
    if response.get("type") == "message" and isinstance(blocks, list):
        text = "".join(b.get("text") or "" for b in blocks if isinstance(b, dict) and b.get("type") == "text")
        calls = [{"id": b.get("id"), "type": "function", "function": {"name": b.get("name"), "arguments": b.get("input")}}
                 for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
        return {"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}
    return None
