"""Which later result stands for an earlier one: the nearest later ok result that supersedes it (the
same value of the rule's `supersede_on` argument, or a newer revision of the same document where the
rule names `revision_on`), and the one that retries a failed call.

The assembler replaces a superseded result by a pointer to its replacement (an older observation never
passes for current) and keeps a failed call verbatim until it is retried (policies/assembly_state.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from policies.memories import ArtifactView
from policies.policy import ToolRule
from policies.result_facts import argument_value, revision_of

Revisions = dict[int, "tuple[int, float | str] | None"]  # result index -> its revision, where its rule names one
Key = tuple[str, str]  # (the rule's `supersede_on`, the value there)
Call = tuple["str | None", "str | None"]  # (tool name, arguments)


@dataclass(frozen=True)
class Scan:
    """`later_results` of the results below index `end`, and what extending it to later results reads
    (`extend`): the first ok result of each key and of each call, the results a later one may still
    supersede (keyed, their rule naming no revision, none superseding them yet) and the failed ones a
    later one may still retry (none retrying them yet: their call, and their key where no later result
    of that key came). Never changed once made: `extend` makes another."""

    end: int
    superseder: dict[int, int]
    retried_at: dict[int, int]
    first_by_key: dict[Key, int]
    first_by_call: dict[Call, int]
    open_keys: dict[int, Key]
    open_errors: dict[int, "tuple[Call, Key | None]"]


def later_results(artifacts: Mapping[int, ArtifactView],
                  rule: Callable[[int], ToolRule]) -> tuple[dict[int, int], dict[int, int], Revisions]:
    """(superseder, retried_at, revision): for each result, the nearest later ok result that supersedes it
    and the one that retries it, by index; and each result's revision, where its rule names one."""
    found = scan(artifacts, rule)
    return found.superseder, found.retried_at, revisions(artifacts, rule, found.superseder)


def scan(artifacts: Mapping[int, ArtifactView], rule: Callable[[int], ToolRule], start: int = 0) -> Scan:
    """The superseders and retries among the results at `start` and after (no revisions: `revisions`)."""
    superseder: dict[int, int] = {}
    retried_at: dict[int, int] = {}
    latest_by_key: dict[Key, int] = {}
    latest_by_call: dict[Call, int] = {}
    open_keys: dict[int, Key] = {}
    open_errors: dict[int, tuple[Call, Key | None]] = {}
    indices = sorted((i for i in artifacts if i >= start), reverse=True)
    for index in indices:
        view, found_rule = artifacts[index], rule(index)
        key = argument_value(view.arguments, found_rule.supersede_on) if found_rule.supersede_on else None
        keyed = (found_rule.supersede_on, key) if found_rule.supersede_on and key is not None else None
        if keyed and not found_rule.revision_on:
            if keyed in latest_by_key:
                superseder[index] = latest_by_key[keyed]
            else:
                open_keys[index] = keyed
        if view.status == "error":
            call = (view.tool_name, view.arguments)
            retries = [latest_by_call.get(call)]
            if keyed:
                retries.append(latest_by_key.get(keyed))
            found = [r for r in retries if r is not None and artifacts[r].tool_name == view.tool_name]
            if found:
                retried_at[index] = min(found)
            else:  # no later result of its call; of its key, none or another tool's (which never retries it)
                open_errors[index] = (call, keyed if keyed and keyed not in latest_by_key else None)
        if view.status == "ok":
            if keyed:
                latest_by_key[keyed] = index
            latest_by_call[(view.tool_name, view.arguments)] = index
    end = indices[0] + 1 if indices else start
    return Scan(end, superseder, retried_at, latest_by_key, latest_by_call, open_keys, open_errors)


def extend(earlier: Scan, artifacts: Mapping[int, ArtifactView], rule: Callable[[int], ToolRule]) -> Scan:
    """`scan(artifacts, rule)` from `earlier`, the scan of the same results below `earlier.end`: only the
    results from there on are scanned. A result of the earlier ones keeps what it had (the nearest later
    result is among them where it had one); one with nothing yet takes the first new result of its key
    or call, which is the nearest now."""
    new = scan(artifacts, rule, earlier.end)
    superseder = {**earlier.superseder, **new.superseder}
    open_keys = dict(new.open_keys)
    for index, keyed in earlier.open_keys.items():
        later = new.first_by_key.get(keyed)
        if later is None:
            open_keys[index] = keyed
        else:
            superseder[index] = later
    retried_at = {**earlier.retried_at, **new.retried_at}
    open_errors = dict(new.open_errors)
    for index, (call, keyed) in earlier.open_errors.items():
        tool = artifacts[index].tool_name
        candidates = [new.first_by_call.get(call), new.first_by_key.get(keyed) if keyed else None]
        found = [r for r in candidates if r is not None and artifacts[r].tool_name == tool]
        if found:
            retried_at[index] = min(found)
        else:
            open_errors[index] = (call, keyed if keyed and keyed not in new.first_by_key else None)
    return Scan(new.end, superseder, retried_at, {**new.first_by_key, **earlier.first_by_key},
                {**new.first_by_call, **earlier.first_by_call}, open_keys, open_errors)


def revisions(artifacts: Mapping[int, ArtifactView], rule: Callable[[int], ToolRule],
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
