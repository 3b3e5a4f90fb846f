"""Where Anthropic may cache: `cache_control` markers placed where the projection is byte-stable.

Anthropic caches a prompt prefix only up to a `cache_control` marker (it
looks back about 20 blocks from each for an earlier entry), at most four per
request. The client's own markers cannot know what the gateway forwards, so
the gateway places them, in this order of need:
- the client's markers on tools and the system prompt stay (the gateway never
  changes those);
- the end of this request, so the next request (which extends it) reads it,
  unless the next request is expected to compact a message of it: then nothing
  after the message before that one is marked but the end of the previous
  request (gateway/pipeline/request_path.py `_stable_ends`), since everything up to the last
  marker is written at 1.25x the input price and the move rewrites it unread;
- the end of the previous request on this path, which this one extends
  (what the provider wrote last time);
- the end of the compacted prefix (the epoch boundary), which stays the same
  bytes until the boundary moves, so even a move reads everything before it.
Markers go on the last block of a message that can carry one (not a thinking
block, not an empty text).
"""
from __future__ import annotations

from typing import Any, Sequence

MAX_MARKERS = 4
MARKER = {"type": "ephemeral"}


def _client_markers(body: dict[str, Any]) -> int:
    count = sum(1 for tool in body.get("tools") or [] if isinstance(tool, dict) and tool.get("cache_control"))
    system = body.get("system")
    if isinstance(system, list):
        count += sum(1 for block in system if isinstance(block, dict) and block.get("cache_control"))
    return count


def _markable(block: Any) -> bool:
    if not isinstance(block, dict) or block.get("type") in ("thinking", "redacted_thinking"):
        return False
    return not (block.get("type") == "text" and not block.get("text"))


def place_markers(body: dict[str, Any], spots: Sequence[tuple[int, int] | None],
                  stable: Sequence[int]) -> dict[str, Any]:
    """`body` with markers after the neutral messages `stable` (most needed first).

    `spots[i]` is where neutral message i landed: (message index, block index) in `body["messages"]`.
    """
    budget = MAX_MARKERS - _client_markers(body)
    messages = [dict(m) for m in body["messages"]]
    chosen: list[tuple[int, int]] = []
    for neutral in stable:
        spot = _spot(messages, spots, neutral)
        if spot is not None and spot not in chosen:
            chosen.append(spot)
        if len(chosen) >= budget:
            break
    for message_index, block_index in chosen:
        message = messages[message_index]
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        content = list(content)
        content[block_index] = {**content[block_index], "cache_control": MARKER}
        messages[message_index] = {**message, "content": content}
    return {**body, "messages": messages}


def _spot(messages: list[dict[str, Any]], spots: Sequence[tuple[int, int] | None],
          neutral: int) -> tuple[int, int] | None:
    """The markable block at (or before) where neutral message `neutral` ends, if any."""
    while 0 <= neutral < len(spots):
        spot = spots[neutral]
        if spot is not None:
            message_index, block_index = spot
            content = messages[message_index]["content"]
            if isinstance(content, str):
                return spot if content else None
            while block_index >= 0:
                if _markable(content[block_index]):
                    return message_index, block_index
                block_index -= 1
        neutral -= 1
    return None
