"""Anthropic's context editing as the fake Messages API plays it (`context_management`, beta
`context-management-2025-06-27`): the edits run on the request before its prompt is cached or counted.

- `clear_tool_uses_20250919`: once the prompt passes `trigger` (input tokens, default 100,000; or a
  count of tool uses), the results of every tool use but the latest `keep` (default 3) are replaced by a
  placeholder, oldest first, in batches that free at least `clear_at_least` input tokens (an incomplete
  last batch stays, so the cleared prefix only grows between requests and each batch costs one cache
  miss); `exclude_tools` are never cleared; `clear_tool_inputs` (true, or tool names) clears those
  uses' inputs too.
- `clear_thinking_20251015`: thinking blocks of all but the latest `keep` assistant turns that have
  them are removed (`keep: "all"` keeps them all).

Each edit that cleared something is reported in `applied_edits` (with what it freed), on the message
and on a stream's `message_delta`, as Anthropic reports it. Tokens are the fake's stand-in tokenizer's.
"""
from __future__ import annotations

from typing import Any, Callable

BETA = "context-management-2025-06-27"
CLEARED = "[cleared by context management]"
DEFAULT_TRIGGER = {"type": "input_tokens", "value": 100_000}
DEFAULT_KEEP = {"type": "tool_uses", "value": 3}
# Server-side compaction (`compact_20260112`) is taken but not played: a test scripts its compaction block.
KNOWN = ("clear_tool_uses_20250919", "clear_thinking_20251015", "compact_20260112")

Tokens = Callable[[Any], int]


def refusal(body: dict[str, Any], betas: str) -> str | None:
    """Why Anthropic would refuse the request's `context_management` (None: it takes it)."""
    config = body.get("context_management")
    if config is None:
        return None
    if BETA not in {b.strip() for b in betas.split(",")}:
        return f"context_management: requires the anthropic-beta {BETA}"
    if not isinstance(config, dict) or not isinstance(config.get("edits", []), list):
        return "context_management: an object with a list of edits"
    for index, edit in enumerate(config.get("edits", [])):
        if not isinstance(edit, dict) or edit.get("type") not in KNOWN:
            return f"context_management.edits.{index}: unknown edit"
    return None


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(m) for m in body.get("messages") or []]


def _blocks(message: dict[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def clear_tool_uses(body: dict[str, Any], edit: dict[str, Any], tokens: Tokens,
                    prompt_tokens: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    messages = _messages(body)
    excluded = set(edit.get("exclude_tools") or ())
    inputs = edit.get("clear_tool_inputs")
    uses = [(b["id"], b.get("name")) for m in messages if m.get("role") == "assistant" for b in _blocks(m)
            if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") not in excluded]
    results = {b["tool_use_id"]: b for m in messages for b in _blocks(m)
               if isinstance(b, dict) and b.get("type") == "tool_result"}
    keep = (edit.get("keep") or DEFAULT_KEEP).get("value", 3)
    trigger = edit.get("trigger") or DEFAULT_TRIGGER
    measure = len(uses) if trigger.get("type") == "tool_uses" else prompt_tokens
    if len(uses) <= keep or measure <= trigger.get("value", 0):
        return body, None
    clears_input = (lambda name: True) if inputs is True else (lambda name: name in (inputs or ()))
    freed: dict[str, int] = {}
    for use_id, name in uses[: len(uses) - keep]:
        if use_id in results and results[use_id].get("content") != CLEARED:
            freed[use_id] = max(0, tokens(results[use_id]) - tokens({**results[use_id], "content": CLEARED}))
    least = (edit.get("clear_at_least") or {}).get("value", 0)
    chosen: list[str] = []
    batch: list[str] = []
    batch_tokens = 0
    for use_id, amount in freed.items():
        batch.append(use_id)
        batch_tokens += amount
        if batch_tokens >= least:
            chosen += batch
            batch, batch_tokens = [], 0
    if not chosen:
        return body, None
    names = dict(uses)
    for message in messages:
        blocks = _blocks(message)
        if not blocks:
            continue
        message["content"] = [_cleared(b, chosen, names, clears_input) for b in blocks]
    applied = {"type": "clear_tool_uses_20250919", "cleared_tool_uses": len(chosen),
               "cleared_input_tokens": sum(freed[i] for i in chosen)}
    return {**body, "messages": messages}, applied


def _cleared(block: Any, chosen: list[str], names: dict[str, Any], clears_input: Callable[[Any], bool]) -> Any:
    if not isinstance(block, dict):
        return block
    if block.get("type") == "tool_result" and block.get("tool_use_id") in chosen:
        return {**block, "content": CLEARED}
    if block.get("type") == "tool_use" and block.get("id") in chosen and clears_input(names.get(block["id"])):
        return {**block, "input": {}}
    return block


def clear_thinking(body: dict[str, Any], edit: dict[str, Any],
                   tokens: Tokens) -> tuple[dict[str, Any], dict[str, Any] | None]:
    keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
    if keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all"):
        return body, None
    messages = _messages(body)
    thinking = ("thinking", "redacted_thinking")
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"
             and any(isinstance(b, dict) and b.get("type") in thinking for b in _blocks(m))]
    cleared = turns[: max(0, len(turns) - int(keep.get("value", 1)))]
    if not cleared:
        return body, None
    freed = 0
    for index in cleared:
        blocks = _blocks(messages[index])
        freed += sum(tokens(b) for b in blocks if isinstance(b, dict) and b.get("type") in thinking)
        messages[index] = {**messages[index], "content": [b for b in blocks if not (
            isinstance(b, dict) and b.get("type") in thinking)]}
    applied = {"type": "clear_thinking_20251015", "cleared_thinking_turns": len(cleared),
               "cleared_input_tokens": freed}
    return {**body, "messages": messages}, applied


def apply_edits(body: dict[str, Any], tokens: Tokens,
                prompt_tokens: Callable[[dict[str, Any]], int]) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """The request as the model sees it after its edits, and the edits applied (None: none were asked)."""
    config = body.get("context_management")
    if not isinstance(config, dict):
        return body, None
    applied: list[dict[str, Any]] = []
    for edit in config.get("edits") or []:
        if edit.get("type") == "clear_tool_uses_20250919":
            body, done = clear_tool_uses(body, edit, tokens, prompt_tokens(body))
        elif edit.get("type") == "clear_thinking_20251015":
            body, done = clear_thinking(body, edit, tokens)
        else:
            done = None
        if done is not None:
            applied.append(done)
    return body, applied
