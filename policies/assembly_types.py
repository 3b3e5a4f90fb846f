"""What the assembler takes and gives: the store's records of a path, and the projection with its
decisions (policies/assembler.py makes one from the other)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

from policies.bounded_cache import views_text
from policies.memo import memo
from policies.memories import ArtifactView

ASSEMBLER_VERSION = "1"
REFERENCING = frozenset({"compacted", "stale", "superseded", "withheld", "arguments_compacted"})


class ContextBudgetExceeded(Exception):
    def __init__(self, needed: int, budget: int) -> None:
        self.needed, self.budget = needed, budget
        super().__init__(
            f"the messages that must be forwarded verbatim take {needed} tokens; "
            f"the policy's prompt budget is {budget}"
        )


@dataclass(frozen=True)
class Records:
    """What the store knows of the path: artifacts by the index of their tool message."""

    artifacts: Mapping[int, ArtifactView]
    argument_refs: Mapping[tuple[int, str], str] = field(default_factory=dict)  # (index, call id) -> artifact id
    sibling_artifacts: int = 0  # artifacts of the same session off this path
    subagent_results: Mapping[str, str] = field(default_factory=dict)  # sha256 -> tool name, of child runs' results
    rehydrated: frozenset[str] = frozenset()  # artifact ids a model had back whole through the rehydration tool
    views_chars: int | None = None  # `views_text(artifacts)`, where the maker counted it (None: count it)

    def text_chars(self) -> int:
        """The characters of text the views hold (`policies.bounded_cache.views_text`): what a cache of
        them weighs."""
        return self.views_chars if self.views_chars is not None else views_text(self.artifacts)

    def lineage(self) -> set[str]:
        """Every artifact id this request's path may name: its results and its calls' arguments."""
        return {v.artifact_id for v in self.artifacts.values()} | set(self.argument_refs.values())


@dataclass(frozen=True)
class Decision:
    index: int
    role: str
    # verbatim | compacted | stale | superseded | withheld | omitted | protected | rehydrated
    # | arguments_compacted | thought_compacted (an old turn's prose cut to a note, no artifact named)
    action: str
    reason: str
    artifact_id: str | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    kept: str = ""  # a memory's lines and why each was kept, e.g. "1-2 head; 24 condition+negation; 80 tail"

    def as_dict(self) -> dict[str, Any]:
        out = {
            "index": self.index, "role": self.role, "action": self.action, "reason": self.reason,
            "artifact_id": self.artifact_id, "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
        }
        if self.kept:
            out["kept"] = self.kept
        return out

    @classmethod
    @memo(maxsize=65536)
    def as_is(cls, index: int, role: str, tokens: int) -> "Decision":
        """`verbatim(index, role, tokens)`, one instance for equal arguments: a decision is a frozen value,
        and an agent's every request decides `verbatim` again for the same messages in the same places
        (a memo look-up instead of an instance per message per request)."""
        return cls.verbatim(index, role, tokens)

    @classmethod
    def verbatim(cls, index: int, role: str, tokens: int) -> "Decision":
        """`Decision(index, role, "verbatim", "kept", None, tokens, tokens)`, made in half the time: every
        request decides this for most of its messages (`_filled`)."""
        return cls._filled(index, role, "verbatim", "kept", None, tokens, tokens, "")

    def with_reason(self, reason: str) -> "Decision":
        """This decision with another `reason` (`dataclasses.replace` takes four times as long: an epoch's
        move renames the reason of every memory taken again, some 200 a request at 1,000 messages). Only
        the fields are copied, nothing kept beside them."""
        return Decision._filled(self.index, self.role, self.action, reason, self.artifact_id, self.tokens_before,
                                self.tokens_after, self.kept)

    @classmethod
    def _filled(cls, index: int, role: str, action: str, reason: str, artifact_id: str | None, tokens_before: int,
                tokens_after: int, kept: str) -> "Decision":
        """A decision of these fields, every one given (`Decision.of`): a frozen dataclass's `__init__` sets
        each field through `object.__setattr__`; filling the instance's dict directly is what that amounts to."""
        decision = object.__new__(cls)
        decision.__dict__.update(index=index, role=role, action=action, reason=reason, artifact_id=artifact_id,
                                 tokens_before=tokens_before, tokens_after=tokens_after, kept=kept)
        return decision

    of = _filled  # `Decision(...)` with every field given positionally, in two thirds of the time


@dataclass(frozen=True)
class Projection:
    messages: list[dict[str, Any]]
    decisions: tuple[Decision, ...]
    omissions: dict[str, int]
    tokens_original: int
    tokens_forwarded: int
    policy_name: str
    policy_version: str
    boundary_round: int  # rounds before this are rendered as of the epoch
    epoch_round: int  # the round count at which the current epoch began
    boundary_index: int = -1  # the last message of the last round before the boundary (-1: none)
    next_move_from: int | None = None  # the first message the next move is expected to change (if foreseen)
    next_move_due: bool = False  # the next request is expected to make that move
    assembler_version: str = ASSEMBLER_VERSION
    # Whether forwarded message i is the client's message i as it came (a copy of it no decision
    # changed), when no message was omitted (else empty).
    as_sent: tuple[bool, ...] = ()

    @property
    def names_artifacts(self) -> bool:
        """Whether any forwarded message stands in for content by naming `artifact:<id>`."""
        return self.first_reference is not None

    @cached_property  # the decisions are a tuple: read once, not once per use (one per message)
    def aligned(self) -> bool:
        """Whether forwarded message i stands for the client's message i (no message was omitted)."""
        # Only the budget omits a message, and it then forwards fewer: the counts tell, without a pass.
        return len(self.messages) == len(self.decisions)

    @cached_property
    def first_reference(self) -> int | None:
        """The first message that stands in for content by naming `artifact:<id>` (None: none does)."""
        return next((d.index for d in self.decisions if d.action in REFERENCING), None)
