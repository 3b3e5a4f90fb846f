"""The fake's context editing (gateway/fake_upstream/context_edits.py) keeps Anthropic's rules: the trigger,
the latest uses kept, batches worth `clear_at_least`, excluded tools, and thinking kept per turn."""
from __future__ import annotations

from typing import Any

from gateway.fake_upstream.context_edits import CLEARED, apply_edits
from gateway.fake_upstream.messages import block_tokens, prompt_blocks


def transcript(sizes: list[int], name: str = "Read") -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n, size in enumerate(sizes):
        messages += [{"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                       {"type": "tool_use", "id": f"t{n}", "name": name, "input": {}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{n}",
                                                   "content": "x" * size}]}]
    return {"messages": messages}


def edit(body: dict[str, Any], *edits: dict[str, Any]) -> tuple[list[Any], list[dict[str, Any]] | None]:
    edited, applied = apply_edits({**body, "context_management": {"edits": list(edits)}}, block_tokens,
                                  lambda b: sum(block_tokens(x) for x in prompt_blocks(b)))
    results = [b["content"] for m in edited["messages"] for b in m["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result"]
    return results, applied


def test_old_results_are_cleared_past_the_trigger_in_whole_batches() -> None:
    body = transcript([400] * 6)
    clear = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 100},
             "keep": {"type": "tool_uses", "value": 2}, "clear_at_least": {"type": "input_tokens", "value": 250}}
    results, applied = edit(body, clear)  # four candidates (two kept) of about 100 tokens each
    assert results == [CLEARED] * 3 + ["x" * 400] * 3  # a batch of three; the fourth's batch is short
    assert applied is not None and applied[0]["cleared_tool_uses"] == 3 and applied[0]["cleared_input_tokens"] >= 250
    under = edit(body, {**clear, "trigger": {"type": "input_tokens", "value": 10**6}})
    assert under == (["x" * 400] * 6, [])  # under the trigger: nothing
    assert edit(transcript([400] * 6, "Write"), {**clear, "exclude_tools": ["Write"]})[1] == []


def test_thinking_is_cleared_but_for_the_latest_turns() -> None:
    body = transcript([10] * 3)
    _, applied = edit(body, {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}})
    assert applied is not None and applied[0]["cleared_thinking_turns"] == 2
    assert edit(body, {"type": "clear_thinking_20251015", "keep": "all"})[1] == []
