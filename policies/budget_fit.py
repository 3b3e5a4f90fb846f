"""Fitting a projection into the policy's prompt budget (`budget.max_prompt_tokens`), the assembler's
last step: compact more, then drop the oldest rounds, else refuse.

What it reads of the assembly is stated by `BudgetFacts` (policies/assembly_state.py's `Assembly` has
them): this module does not import the assembler, which imports it."""
from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Protocol, Sequence

from policies.assembly_types import ContextBudgetExceeded, Decision, Records
from policies.policy import Policy, ToolRule
from policies.rounds import Round
from policies.tokens import message_tokens


class BudgetFacts(Protocol):
    """What `fit_budget` reads of an assembly: the policy, the messages with their tokens, rounds and
    records, and per tool result its rule, whether it must stay verbatim, its compact form and memory."""

    policy: Policy
    encoding: str
    messages: Sequence[Mapping[str, Any]]
    tokens: list[int]
    rounds: Sequence[Round]
    records: Records

    def rule(self, index: int) -> ToolRule: ...

    def protected(self, index: int, upto: int) -> str | None: ...

    def compact_form(self, index: int) -> tuple[str, int, str]: ...

    def kept(self, index: int, stale: str | None = None) -> str: ...


def fit_budget(state: BudgetFacts, out: list[dict[str, Any]], decisions: dict[int, Decision],
                omissions: Counter[str], latest: set[int]) -> list[dict[str, Any]]:
    """`out` within the policy's prompt budget: old results compacted whatever the epochs, then the oldest
    prose and whole tool rounds dropped (decisions say which), else ContextBudgetExceeded."""
    budget = state.policy.budget.max_prompt_tokens
    assert budget is not None
    tokens = [message_tokens(m, state.encoding) for m in out]
    if sum(tokens) <= budget:
        return out
    last_round = {i for rnd in state.rounds[-1:] for i in (rnd.assistant, *rnd.tools)}
    # 1. compact every old result that may be compacted, epochs notwithstanding
    for index, message in enumerate(state.messages):
        view = state.records.artifacts.get(index)
        if message.get("role") != "tool" or view is None or index in last_round:
            continue
        if index in decisions and decisions[index].action != "verbatim" or not state.rule(index).compact:
            continue
        if state.protected(index, len(state.rounds)):
            continue
        text, after, form = state.compact_form(index, len(state.rounds))
        if after < tokens[index]:
            out[index] = {**out[index], "content": text}
            decisions[index] = Decision(index, "tool", "compacted", "over_budget", view.artifact_id,
                                        state.tokens[index], after, state.kept(index, upto=len(state.rounds)) if form == "memory" else "")
            tokens[index] = after
    if sum(tokens) <= budget:
        return out
    # 2. drop the oldest droppable units: assistant prose, or whole tool rounds
    dropped: set[int] = set()
    units: list[tuple[int, ...]] = []
    # prose from the latest round on (a closing answer, a prefill) belongs to the latest exchange
    latest_start = state.rounds[-1].assistant if state.rounds else len(state.messages)
    for index, message in enumerate(state.messages[:latest_start]):
        if message.get("role") == "assistant" and not message.get("tool_calls") and index not in latest:
            units.append((index,))
    for rnd in state.rounds:
        members = (rnd.assistant, *rnd.tools)
        if rnd.assistant in last_round:
            continue
        if any(state.protected(i, len(state.rounds)) for i in rnd.tools):
            continue
        units.append(members)
    units.sort()
    total = sum(tokens)
    for unit in units:
        if total <= budget:
            break
        for index in unit:
            dropped.add(index)
            total -= tokens[index]
            decisions[index] = Decision(index, str(state.messages[index].get("role")), "omitted", "over_budget",
                                        decisions[index].artifact_id if index in decisions else None,
                                        state.tokens[index], 0)
        omissions["over_budget"] += len(unit)
    if total > budget:
        raise ContextBudgetExceeded(total, budget)
    return [m for i, m in enumerate(out) if i not in dropped]
