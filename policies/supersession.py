"""Which later result stands for an earlier one: the nearest later ok result that supersedes it (the
same value of the rule's `supersede_on` argument, or a newer revision of the same document where the
rule names `revision_on`), and the one that retries a failed call.

The assembler replaces a superseded result by a pointer to its replacement (an older observation never
passes for current) and keeps a failed call verbatim until it is retried (policies/assembly_state.py).
"""
from __future__ import annotations

from typing import Callable, Mapping

from policies.memories import ArtifactView
from policies.policy import ToolRule
from policies.result_facts import argument_value, revision_of

Revisions = dict[int, "tuple[int, float | str] | None"]  # result index -> its revision, where its rule names one


def later_results(artifacts: Mapping[int, ArtifactView],
                  rule: Callable[[int], ToolRule]) -> tuple[dict[int, int], dict[int, int], Revisions]:
    """(superseder, retried_at, revision): for each result, the nearest later ok result that supersedes it
    and the one that retries it, by index; and each result's revision, where its rule names one."""
    superseder: dict[int, int] = {}
    retried_at: dict[int, int] = {}
    latest_by_key: dict[tuple[str, str], int] = {}
    latest_by_call: dict[tuple[str | None, str | None], int] = {}
    for index in sorted(artifacts, reverse=True):
        view, found_rule = artifacts[index], rule(index)
        key = argument_value(view.arguments, found_rule.supersede_on) if found_rule.supersede_on else None
        keyed = (found_rule.supersede_on, key) if found_rule.supersede_on and key is not None else None
        if keyed and keyed in latest_by_key and not found_rule.revision_on:
            superseder[index] = latest_by_key[keyed]
        if view.status == "error":
            retries = [latest_by_call.get((view.tool_name, view.arguments))]
            if keyed:
                retries.append(latest_by_key.get(keyed))
            found = [r for r in retries if r is not None and artifacts[r].tool_name == view.tool_name]
            if found:
                retried_at[index] = min(found)
        if view.status == "ok":
            if keyed:
                latest_by_key[keyed] = index
            latest_by_call[(view.tool_name, view.arguments)] = index
    return superseder, retried_at, _revisions(artifacts, rule, superseder)


def _revisions(artifacts: Mapping[int, ArtifactView], rule: Callable[[int], ToolRule],
               superseder: dict[int, int]) -> Revisions:
    """Where a rule names a revision, the first result (by position) of the same document with a
    higher revision, or the same revision fetched later, supersedes a result (set in `superseder`):
    re-reading an old revision never passes for current. Gives each such result's revision."""
    documents: dict[tuple[str, str], list[int]] = {}
    revision: Revisions = {}
    for index in sorted(artifacts):
        view, found_rule = artifacts[index], rule(index)
        if not (found_rule.supersede_on and found_rule.revision_on):
            continue
        key = argument_value(view.arguments, found_rule.supersede_on)
        if key is not None:
            documents.setdefault((found_rule.supersede_on, key), []).append(index)
            revision[index] = revision_of(view, found_rule.revision_on)
    for members in documents.values():
        for index in members:
            mine = revision[index]
            for other in members:
                if other == index or artifacts[other].status != "ok":
                    continue
                theirs = revision[other]
                if mine is None or theirs is None:
                    beats = other > index
                else:
                    beats = theirs > mine or (theirs == mine and other > index)
                if beats:
                    superseder[index] = other  # members are in order: the first that beats it
                    break
    return revision
