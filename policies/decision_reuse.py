"""The decisions of a conversation's previous request, taken again for the messages whose inputs are
unchanged (see `unchanged`).

What it reads of the assembly is stated by `ReuseFacts` (policies/assembly_state.py's `Assembly` has
them): this module does not import the assembler, which imports it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from policies.assembly_types import Decision
from policies.bounded_cache import views_cache
from policies.epoch_replay import Epochs
from policies.policy import Policy
from policies.rounds import Round


# What the decision loop of `assemble` decided for a request, by (node id of its last message, context):
# the conversation's next request takes the same decisions for the messages whose inputs are unchanged
# (see `unchanged`) and decides the rest again. One entry per request; small values (decisions,
# memories' texts); the views are the records' own, holding the results' texts: a bounded share of them.
DECISIONS = views_cache(lambda decided: decided.chars)


@dataclass(frozen=True)
class Decided:
    length: int
    last_round: Round | None
    last_end: int  # the last message of the last round (-1: none)
    now: float
    views: dict[int, Any]  # the records' views, by index
    latest: frozenset[int]
    trailing: frozenset[int]
    superseder: dict[int, int]
    retried_at: dict[int, int]
    duplicate: dict[int, tuple[int, bool]]
    boundary: int
    epoch_round: int
    as_of: dict[int, int]
    pinned: frozenset[int]
    # index -> (decision, content put in its place or None, omission counted or None, its tokens)
    results: dict[int, tuple[Decision, Any, str | None, int | None]]
    # assistant index -> its call arguments compacted (`Assembly.compacted_arguments`): a function of
    # its message, the artifact ids its calls' arguments were given (named by its node id) and the context
    arguments: dict[int, Any]
    chars: int  # the text the views hold (`Records.text_chars`): what the entry weighs


class ReuseFacts(Protocol):
    """What `unchanged` reads of an assembly: the previous request's decisions, the policy, the time, the
    rounds, and which later result supersedes, retries or repeats each result."""

    previous: Decided | None
    policy: Policy
    messages: Sequence[Mapping[str, Any]]
    now: float
    rounds: Sequence[Round]
    round_of: Mapping[int, int]
    superseder: dict[int, int]
    retried_at: dict[int, int]
    duplicate: dict[int, tuple[int, bool]]


def unchanged(state: ReuseFacts, epochs: Epochs, latest: set[int], trailing: set[int]) -> tuple[Decided, set[int]] | None:
    """The decisions of the latest earlier request of this conversation (ending within the last few
    messages) and the messages of its length whose decision may differ now (None: none to reuse).

    A tool message's decision reads, besides the context of `Assembly.context_key` and what its node
    id names (its message and every one before it): its view (owner, observation time), `now` (only
    through staleness), whether it is among the latest rounds or the trailing results, what supersedes
    it, what retries it, its earlier duplicate, whether its round is behind the boundary and as of which
    round it is rendered, whether it is pinned, and the epoch (only in the reason `epoch:N`). Whatever
    of these differs from the earlier request's marks it to be decided again, and so do the memories
    rendered as of the latest round when a user turn came since (they read what it asks about)."""
    previous = state.previous
    if previous is None:
        return None
    policy = state.policy
    if previous.now != state.now and (policy.rule_for(None).stale_after is not None
                                      or any(r.stale_after is not None for r in policy.tools)):
        return None
    if previous.last_round is not None:  # the new messages may have extended its last round
        number = state.round_of.get(previous.last_round.assistant)
        if number is None or state.rounds[number - 1] != previous.last_round:
            return None
    dirty = set(latest) | trailing | previous.latest | previous.trailing
    for now_, then in ((state.superseder, previous.superseder), (state.retried_at, previous.retried_at),
                       (state.duplicate, previous.duplicate)):
        if now_ != then:
            dirty.update(k for k in now_.keys() | then.keys() if now_.get(k) != then.get(k))
    for table in (state.superseder, state.retried_at):  # a later result outside the rounds counted then
        dirty.update(k for k, v in table.items() if v > previous.last_end)
    if epochs.boundary != previous.boundary:
        low, high = sorted((epochs.boundary, previous.boundary))
        for rnd in state.rounds[low:high]:
            dirty.update(rnd.tools)
    if epochs.pinned != previous.pinned:
        dirty.update(epochs.pinned ^ previous.pinned)
    if epochs.as_of != previous.as_of:
        for number in epochs.as_of.keys() | previous.as_of.keys():
            if epochs.as_of.get(number) != previous.as_of.get(number) and 0 < number <= len(state.rounds):
                dirty.update(state.rounds[number - 1].tools)
    # A memory rendered as of the latest round reads the user turns up to the request's end
    # (`Assembly.salience_terms`): a user turn since the earlier request may change it.
    if policy.compaction.follow_conversation and any(
            state.messages[i].get("role") == "user" for i in range(previous.length, len(state.messages))):
        for number, as_of in epochs.as_of.items():
            if as_of == len(state.rounds) and 0 < number <= len(state.rounds):
                dirty.update(state.rounds[number - 1].tools)
    return previous, dirty
