"""The tool rounds of a transcript (an assistant message with calls, and the tool messages that
answer it), and the round of each message, resumed from an earlier request of the conversation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from policies.bounded_cache import BoundedCache

PREFIX_LOOKBACK = 16  # where an earlier request of the conversation may have ended: its last few messages


def last_positions(count: int) -> range:
    """The positions of a sequence of `count` items an earlier request may have ended at, the last first."""
    return range(count - 1, max(-1, count - 1 - PREFIX_LOOKBACK), -1)


@dataclass(frozen=True)
class Round:
    assistant: int
    tools: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.tools[-1] if self.tools else self.assistant


def tool_rounds(messages: Sequence[Mapping[str, Any]], start: int = 0) -> list[Round]:
    """The tool rounds of `messages` from `start` (the first message, or where a round starts) on."""
    rounds: list[Round] = []
    i = start
    while i < len(messages):
        if messages[i].get("role") == "assistant" and messages[i].get("tool_calls"):
            j = i + 1
            while j < len(messages) and messages[j].get("role") == "tool":
                j += 1
            rounds.append(Round(assistant=i, tools=tuple(range(i + 1, j))))
            i = j
        else:
            i += 1
    return rounds


# The rounds of a conversation and the round of each of their messages, by the node id of its last
# message (which names every message before it): the next request scans only from the previous one's
# last round on (which its new messages may extend). Not mutated once stored.
_ROUNDS = BoundedCache(256)


def rounds_and_numbers(messages: Sequence[Mapping[str, Any]],
                        node_ids: Sequence[str] | None) -> tuple[list[Round], dict[int, int]]:
    """`tool_rounds(messages)` and message index -> round number (from 1), resumed from an earlier
    request's that ended within the last few messages."""
    rounds: list[Round] = []
    round_of: dict[int, int] = {}
    start = 0
    if node_ids:
        for position in last_positions(len(messages)):
            found = _ROUNDS.get(node_ids[position])
            if found is not None:
                earlier, earlier_of = found
                if earlier:  # its last round may go on in the new messages: scanned again
                    rounds, round_of, start = list(earlier[:-1]), dict(earlier_of), earlier[-1].assistant
                break
    for rnd in tool_rounds(messages, start):
        rounds.append(rnd)
        number = len(rounds)
        for index in (rnd.assistant, *rnd.tools):
            round_of[index] = number
    if node_ids:
        _ROUNDS.put(node_ids[-1], (tuple(rounds), dict(round_of)))
    return rounds, round_of
