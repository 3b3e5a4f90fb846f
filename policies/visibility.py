"""Who may see a tool result, and how: the one rule the assembler and rehydration both apply.

May participant P, on provider X, see artifact A raw, only as a memory, or
not at all? In order:
- a privacy class the policy does not allow for provider X: not at all
  (a memory quotes the content, so it may not go either);
- another participant's result: as the tool rule's `visibility` says:
  `conversation` raw, `memory` only its memory, `participant` not at all;
- a result a subagent captured, seen from its parent's conversation: not at
  all, unless the child tool's rule sets `promote_to_parent`;
- otherwise raw.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

from policies.memories import ArtifactView
from policies.policy import Policy

Level = Literal["raw", "memory", "none"]


@dataclass(frozen=True)
class Access:
    level: Level
    reason: str | None = None  # why less than raw: restricted:<class>, private:<owner>, other_participant, ...
    omission: str | None = None  # the omission it is counted under when the result is withheld

    @property
    def raw(self) -> bool:
        return self.level == "raw"


RAW = Access("raw")


def access(
    policy: Policy,
    view: ArtifactView,
    *,
    provider: str,
    participant: str | None,
    subagent_results: Mapping[str, str],
) -> Access:
    """How `participant` (None: the owner of everything, as in offline replay) may see `view` on `provider`."""
    rule = policy.rule_for(view.tool_name)
    if not policy.privacy.allows(provider, rule.privacy):
        return Access("none", f"restricted:{rule.privacy}", "restricted")
    if participant is not None and view.owner_participant and view.owner_participant != participant:
        if rule.visibility == "participant":
            return Access("none", f"private:{view.owner_participant}", "private")
        if rule.visibility == "memory":
            return Access("memory", "other_participant")
    child_tool = subagent_results.get(view.sha256)
    if child_tool is not None and not policy.rule_for(child_tool).promote_to_parent:
        return Access("none", "subagent_private", "subagent_private")
    return RAW


def notice_reason(access: Access, provider: str) -> str:
    """The words that stand in for a result that may not be shown at all."""
    assert access.reason is not None
    if access.reason.startswith("restricted:"):
        return f"{access.reason.split(':', 1)[1]} content not sent to provider {provider}"
    if access.reason.startswith("private:"):
        return "private to another participant"
    return "a subagent's private result"
