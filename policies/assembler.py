"""The assembler: a pure function of (policy, path, records, now) -> Projection.

Rules kept (DESIGN.md, "Rules the assembler must keep"):
- the projection is a valid provider request: every call keeps its answer,
  order is preserved, content is replaced, never a call left unanswered;
- system and user messages and the latest tool rounds go through verbatim,
  and so do failed calls not yet retried and pending (unresolved) results;
- a compacted message names `artifact:<id>`;
- compaction advances in epochs: the boundary moves only when the
  un-compacted tail passes `trigger_tokens` and the move saves at least
  `clear_at_least_tokens`; everything before the boundary is rendered as of
  the epoch that set it, so between epochs each forwarded request extends
  the previous one unchanged and the provider's prefix cache keeps hitting;
- stale results are marked with their age and the tool that refreshes them;
  superseded ones are replaced by a pointer to their replacement; restricted
  raw content never reaches a provider the policy does not allow;
- when what must be kept does not fit the budget, ContextBudgetExceeded.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from operator import is_
from dataclasses import replace
from typing import Any, Mapping, Sequence

from policies.memories import (
    compact_arguments, excerpt, kept_summary, render_memory, render_notice, terms_in, terms_of, text_free,
)
from policies.policy import Policy, ToolRule
from policies.result_facts import (
    argument_value, loose_digest, revision_of, short_values, shown_revision,
)
from policies import decision_reuse
from policies.assembly_types import Decision, Projection, Records
from policies.bounded_cache import VIEWS_TEXT_BUDGET, BoundedCache, views_text
from policies.budget_fit import fit_budget
from policies.epoch_replay import EpochReplay, Epochs
from policies.rounds import PREFIX_LOOKBACK, rounds_and_numbers
from policies.tokens import DEFAULT_ENCODING, count_text, message_tokens
from policies.visibility import Access, access, notice_reason

_RENDERED = BoundedCache(8192)  # memories: rendering is a pure function of the key (which holds no result text)
# The same memories and savings by node id: a node id names its message and every message before it,
# which is all a memory reads besides the policy (its result, the terms named before it) and, with the
# context of `_replay_key`, all a saving reads besides the two facts in its key (see `saving`). Small
# values (the memories' texts are short); spares the per-request work of looking the terms up again.
_NODE_MEMORIES = BoundedCache(65536)
_NODE_SAVINGS = BoundedCache(65536)
# Where the terms of a conversation were first named, by the node id of its last message (which names
# every message before it): the next request looks up only its new messages' terms.
_NAMED_TERMS = BoundedCache(256)



# What `_Assembly._index_duplicates` found for a request (length, views, duplicates and the outputs
# seen by digest), by (node id of its last message, context): the next request looks at its new results
# alone. Not mutated once stored. The views hold the results' texts: a bounded share of them.
_DUPLICATES = BoundedCache(128, max_weight=VIEWS_TEXT_BUDGET, weigh=lambda found: views_text(found[1]))



def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


class _Assembly(EpochReplay):
    """The working state of one assembly; `assemble` is the only entry point."""

    def __init__(self, policy: Policy, messages: Sequence[Mapping[str, Any]], records: Records,
                 now: float, provider: str, encoding: str, participant: str | None,
                 first_move_tokens: int = 0, tokens: Sequence[int] | None = None, foresee: bool = False,
                 node_ids: Sequence[str] | None = None) -> None:
        self.policy, self.c = policy, policy.compaction
        self.first_move_tokens, self.foresee, self.node_ids = first_move_tokens, foresee, node_ids
        # everything besides the messages that a saving reads (see `_replay_key`)
        self.context_key = (policy.fingerprint, provider, encoding, participant, first_move_tokens,
                            frozenset(records.subagent_results.items()))
        self.messages, self.records = messages, records
        self.now, self.provider, self.encoding, self.participant = now, provider, encoding, participant
        self.rounds, self.round_of = rounds_and_numbers(messages, node_ids)
        self.tokens = list(tokens) if tokens is not None else [message_tokens(m, encoding) for m in messages]
        self._memory_cache: dict[tuple[int, str | None], tuple[str, int, str]] = {}
        self._rules: dict[int, ToolRule] = {}
        self._restricted: dict[int, bool] = {}
        self._savings: dict[tuple[int, str | None, str | None], int] = {}
        # A saving reads owners (through which earlier duplicates the requester may see raw) only under
        # rules that show results to some participants alone: shared by node id when none does.
        self._share_savings = node_ids is not None and all(r.visibility == "conversation" for r in policy.tools)
        self._index_later_results()
        self._index_duplicates()
        self._first_named: dict[str, int] | None = None  # term -> where a user turn or call first named it
        self._arguments: dict[int, tuple[dict[str, Any], str, int] | None] = {}
        # what the decision loop of the conversation's latest earlier request decided (see `unchanged`)
        self.previous: decision_reuse.Decided | None = None
        if node_ids and messages:
            for position in range(len(messages) - 1, max(-1, len(messages) - 1 - PREFIX_LOOKBACK), -1):
                self.previous = decision_reuse.DECISIONS.get((node_ids[position], self.context_key))
                if self.previous is not None:
                    self._arguments = dict(self.previous.arguments)
                    break
        self._assistants: list[int] | None = None  # assistant messages before each index

    # -- facts about one tool message, as of a snapshot (rounds <= upto) ---------

    def rule(self, index: int) -> ToolRule:
        if index not in self._rules:
            view = self.records.artifacts.get(index)
            self._rules[index] = self.policy.rule_for(view.tool_name if view else None)
        return self._rules[index]

    def _index_later_results(self) -> None:
        """For each result, the nearest later ok result that supersedes it, and that retries it."""
        self.superseder: dict[int, int] = {}
        self.retried_at: dict[int, int] = {}
        latest_by_key: dict[tuple[str, str], int] = {}
        latest_by_call: dict[tuple[str | None, str | None], int] = {}
        for index in sorted(self.records.artifacts, reverse=True):
            view, rule = self.records.artifacts[index], self.rule(index)
            key = argument_value(view.arguments, rule.supersede_on) if rule.supersede_on else None
            keyed = (rule.supersede_on, key) if rule.supersede_on and key is not None else None
            if keyed and keyed in latest_by_key and not rule.revision_on:
                self.superseder[index] = latest_by_key[keyed]
            if view.status == "error":
                retries = [latest_by_call.get((view.tool_name, view.arguments))]
                if keyed:
                    retries.append(latest_by_key.get(keyed))
                found = [r for r in retries if r is not None and self.records.artifacts[r].tool_name == view.tool_name]
                if found:
                    self.retried_at[index] = min(found)
            if view.status == "ok":
                if keyed:
                    latest_by_key[keyed] = index
                latest_by_call[(view.tool_name, view.arguments)] = index
        self._index_revisions()

    def _index_revisions(self) -> None:
        """Where a rule names a revision, the first result (by position) of the same document with a
        higher revision, or the same revision fetched later, supersedes a result: re-reading an old
        revision never passes for current."""
        documents: dict[tuple[str, str], list[int]] = {}
        self.revision: dict[int, tuple[int, float | str] | None] = {}
        for index in sorted(self.records.artifacts):
            view, rule = self.records.artifacts[index], self.rule(index)
            if not (rule.supersede_on and rule.revision_on):
                continue
            key = argument_value(view.arguments, rule.supersede_on)
            if key is not None:
                documents.setdefault((rule.supersede_on, key), []).append(index)
                self.revision[index] = revision_of(view, rule.revision_on)
        for members in documents.values():
            for index in members:
                mine = self.revision[index]
                for other in members:
                    if other == index or self.records.artifacts[other].status != "ok":
                        continue
                    theirs = self.revision[other]
                    if mine is None or theirs is None:
                        beats = other > index
                    else:
                        beats = theirs > mine or (theirs == mine and other > index)
                    if beats:
                        self.superseder[index] = other  # members are in order: the first that beats it
                        break

    def _index_duplicates(self) -> None:
        """For each ok result, the first earlier ok result with the same output (or the same apart
        from timestamps and timings) that the requester may see raw."""
        self.duplicate: dict[int, tuple[int, bool]] = {}  # index -> (earlier index, exact)
        exact: dict[str, tuple[int, ...]] = {}
        loose: dict[str, tuple[int, ...]] = {}
        artifacts, start = self.records.artifacts, 0
        earlier = self._earlier_duplicates()
        if earlier is not None:
            start, views, found, exact_then, loose_then = earlier
            self.duplicate, exact, loose = dict(found), dict(exact_then), dict(loose_then)
        for index in sorted(i for i in artifacts if i >= start):
            view = artifacts[index]
            if view.status != "ok" or not view.content:
                continue
            normal = loose_digest(view)
            for table, key, is_exact in ((exact, view.sha256, True), (loose, normal, False)):
                if key is None:
                    continue
                if index not in self.duplicate and (first := self._first_seen(table.get(key, ()))) is not None:
                    self.duplicate[index] = (first, is_exact)
                table[key] = (*table.get(key, ()), index)
        if self.node_ids and self.messages and start < len(self.messages):
            _DUPLICATES.put((self.node_ids[-1], self.context_key),
                            (len(self.messages), dict(artifacts), self.duplicate, exact, loose))

    def _earlier_duplicates(self) -> tuple[Any, ...] | None:
        """What `_index_duplicates` found for the latest earlier request of this conversation (ending
        within the last few messages), when every view it read is the one this request has: which earlier
        output a repeat refers to reads only those views (whom each may be shown to) and the context."""
        if not self.node_ids or not self.messages:
            return None
        for position in range(len(self.messages) - 1, max(-1, len(self.messages) - 1 - PREFIX_LOOKBACK), -1):
            found = _DUPLICATES.get((self.node_ids[position], self.context_key))
            if found is not None:
                length, views = found[0], found[1]
                artifacts = self.records.artifacts
                if sum(1 for i in artifacts if i < length) != len(views) or \
                        any(artifacts.get(i) is not v for i, v in views.items()):
                    return None
                return found
        return None

    def _first_seen(self, candidates: Sequence[int]) -> int | None:
        """The first of `candidates` the requester may see raw (checked only when a duplicate is found)."""
        return next((i for i in candidates if self.access(i).raw and not self.restricted(i)), None)

    def terms_before(self, index: int) -> frozenset[str]:
        """The identifiers and amounts of result `index` that user turns and tool-call arguments named
        before it (only what came before, so a memory renders the same on every later request)."""
        if self._first_named is None:
            self._first_named = self._named_terms()
        if not self._first_named:
            return frozenset()
        never = len(self.messages)
        return frozenset(t for t in terms_in(self.records.artifacts[index])
                         if self._first_named.get(t, never) < index)

    def _named_terms(self) -> dict[str, int]:
        """Where a user turn or call first named each term: extends what an earlier request of the
        conversation found in its messages (by the node id of its last, which names them all)."""
        start, named = 0, {}
        if self.node_ids:
            for position in range(len(self.messages) - 1, max(-1, len(self.messages) - 1 - PREFIX_LOOKBACK), -1):
                found = _NAMED_TERMS.get(self.node_ids[position])
                if found is not None:
                    start, named = position + 1, dict(found)
                    break
        for position in range(start, len(self.messages)):
            message = self.messages[position]
            if message.get("role") == "user":
                content = message.get("content")
                text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            elif message.get("role") == "assistant" and message.get("tool_calls"):
                text = " ".join(short_values(arguments) for c in message["tool_calls"] if isinstance(c, Mapping)
                                and isinstance(arguments := (c.get("function") or {}).get("arguments"), str))
            else:
                continue
            for term in terms_of(text):
                named.setdefault(term, position)
        if self.node_ids and start < len(self.messages):
            _NAMED_TERMS.put(self.node_ids[-1], named)
        return named

    def compacted_arguments(self, index: int) -> tuple[dict[str, Any], str, int] | None:
        """The assistant message at `index` with its long call arguments compacted, the first
        artifact they name and its tokens (None: nothing to compact)."""
        if index in self._arguments:
            return self._arguments[index]
        message = self.messages[index]
        calls = []
        changed = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            arguments = function.get("arguments") or ""
            ref = self.records.argument_refs.get((index, call.get("id")))
            if ref and count_text(arguments, self.encoding) >= self.c.argument_min_tokens:
                new = compact_arguments(arguments, ref, self.c, min_chars=self.c.max_line_chars,
                                        redactor=self.policy.redaction.redactor)
                if len(new) < len(arguments):
                    call = {**call, "function": {**function, "arguments": new}}
                    changed.append(ref)
            calls.append(call)
        found = None
        if changed:
            compacted = {**message, "tool_calls": calls}
            found = (compacted, changed[0], message_tokens(compacted, self.encoding))
        self._arguments[index] = found
        return found

    def argument_saving(self, index: int) -> int:
        found = self.compacted_arguments(index)
        return max(0, self.tokens[index] - found[2]) if found else 0

    def _last_index(self, upto: int) -> int:
        return self.rounds[upto - 1].end if upto else -1

    def superseded_by(self, index: int, upto: int) -> str | None:
        later = self.superseder.get(index)
        if later is None or later > self._last_index(upto):
            return None
        return self.records.artifacts[later].artifact_id

    def protected(self, index: int, upto: int) -> str | None:
        """Why a result must stay verbatim (recovery state), as of round `upto`."""
        view = self.records.artifacts.get(index)
        if view is None or view.status == "ok":
            return None
        if view.status == "pending":
            return "unresolved"
        retry = self.retried_at.get(index)
        if retry is not None and retry <= self._last_index(upto):
            return None
        return "failed_not_retried"

    def access(self, index: int) -> Access:
        """How the requesting participant may see this result (policies/visibility.py)."""
        return access(self.policy, self.records.artifacts[index], provider=self.provider,
                      participant=self.participant, subagent_results=self.records.subagent_results)

    def restricted(self, index: int) -> bool:
        if index not in self._restricted:
            self._restricted[index] = not self.policy.privacy.allows(self.provider, self.rule(index).privacy)
        return self._restricted[index]

    def stale_note(self, index: int) -> str | None:
        view, rule = self.records.artifacts.get(index), self.rule(index)
        if view is None or rule.stale_after is None:
            return None
        age = self.now - view.observed_at
        if age <= rule.stale_after:
            return None
        refresh = rule.refresh_with or view.tool_name or "the tool"
        return (f"[STALE: observed {_age(age)} before this request, past its {_age(rule.stale_after)} "
                f"freshness window ({rule.freshness}); call {refresh} again for current data]")

    def memory(self, index: int, stale: str | None = None) -> tuple[str, int]:
        text, tokens, _ = self._memory(index, stale)
        return text, tokens

    def kept(self, index: int, stale: str | None = None) -> str:
        """Which lines the memory of `index` kept, and why (for the assembly record)."""
        return self._memory(index, stale)[2]

    def _memory(self, index: int, stale: str | None) -> tuple[str, int, str]:
        key = (index, stale)
        if key in self._memory_cache:
            return self._memory_cache[key]
        node_key = (self.node_ids[index], self.policy.fingerprint, self.encoding, stale) \
            if self.node_ids is not None else None
        if node_key is not None and (found := _NODE_MEMORIES.get(node_key)) is not None:
            self._memory_cache[key] = found
            return found
        view = self.records.artifacts[index]
        terms = self.terms_before(index)
        shared_key = (self.policy.fingerprint, self.encoding, text_free(view), stale, terms)
        found = _RENDERED.get(shared_key)
        if found is None:
            # Redacted before the excerpt is taken: a secret cut in two by a line's clipping
            # would no longer be recognised.
            redacted = self.policy.redaction.redactor.redact(view.content)
            shown = replace(view, content=redacted.text) if redacted.counts else view
            lines = excerpt(shown, self.rule(index), self.c, terms)
            text = render_memory(shown, self.rule(index), self.c, stale, lines=lines)
            found = (text, message_tokens({**self.messages[index], "content": text}, self.encoding),
                     kept_summary(lines, redacted.counts))
            _RENDERED.put(shared_key, found)
        if node_key is not None:
            _NODE_MEMORIES.put(node_key, found)
        self._memory_cache[key] = found
        return self._memory_cache[key]

    def superseded_notice(self, index: int, replacement: str) -> str:
        view = self.records.artifacts[index]
        later = self.superseder[index]
        if self.revision.get(index) is not None and self.revision.get(later) is not None:
            return (f"[superseded tool result artifact:{view.artifact_id} (revision {shown_revision(self.revision[index])}): "
                    f"replaced by revision {shown_revision(self.revision[later])}, artifact:{replacement}]")
        return f"[superseded tool result artifact:{view.artifact_id}: replaced by artifact:{replacement}]"

    def duplicate_notice(self, index: int) -> tuple[str, int] | None:
        """The reference that stands in for a repeated output, and its tokens (None: not a duplicate)."""
        if index not in self.duplicate:
            return None
        earlier, exact = self.duplicate[index]
        view, first = self.records.artifacts[index], self.records.artifacts[earlier]
        same = "the same output" if exact else "the same output apart from timestamps and timings"
        text = f"[duplicate tool result artifact:{view.artifact_id}: {same} as artifact:{first.artifact_id}]"
        return text, message_tokens({**self.messages[index], "content": text}, self.encoding)

    def compact_form(self, index: int) -> tuple[str, int, str]:
        """(content, tokens, reason) of an old result compacted: a reference to its earlier duplicate,
        or its memory."""
        if (notice := self.duplicate_notice(index)) is not None and notice[1] < self.tokens[index]:
            earlier = self.records.artifacts[self.duplicate[index][0]].artifact_id
            return notice[0], notice[1], f"duplicate_of:{earlier}"
        text, tokens = self.memory(index)
        return text, tokens, "memory"

    def saving(self, index: int, upto: int) -> int:
        """Tokens saved by rendering this result as of round `upto` instead of verbatim."""
        # It depends on `upto` only through these two facts: memoise on them.
        key = (index, self.superseded_by(index, upto), self.protected(index, upto))
        found = self._savings.get(key)
        if found is None:
            node_key = (self.node_ids[index], self.context_key, *key[1:]) if self._share_savings else None
            found = _NODE_SAVINGS.get(node_key) if node_key is not None else None
            if found is None:
                found = self._saving(index, upto)
                if node_key is not None:
                    _NODE_SAVINGS.put(node_key, found)
            self._savings[key] = found
        return found

    def _saving(self, index: int, upto: int) -> int:
        view, rule = self.records.artifacts.get(index), self.rule(index)
        if view is None or not rule.compact or self.restricted(index):
            return 0
        if (replacement := self.superseded_by(index, upto)) is not None:
            notice = self.superseded_notice(index, replacement)
            return max(0, self.tokens[index] - message_tokens({**self.messages[index], "content": notice}, self.encoding))
        if self.protected(index, upto):
            return 0
        small = self.tokens[index] < (rule.min_tokens if rule.min_tokens is not None else self.c.min_tokens)
        if small and index not in self.duplicate:
            return 0  # small results stay whole; a repeated one still becomes a reference
        _, tokens, reason = self.compact_form(index)
        if small and reason == "memory":
            return 0
        return max(0, self.tokens[index] - tokens)



def assemble(
    policy: Policy,
    messages: Sequence[Mapping[str, Any]],
    records: Records,
    now: float,
    *,
    provider: str = "openai",
    encoding: str = DEFAULT_ENCODING,
    participant: str | None = None,
    first_move_tokens: int = 0,
    tokens: Sequence[int] | None = None,
    foresee: bool = False,
    node_ids: Sequence[str] | None = None,
) -> Projection:
    """Project `messages` for `participant` (None: whoever owns everything) at `now`.

    `first_move_tokens`: what the first compaction adds to the prompt besides its memories (the
    rehydration tool, when it is declared where the first memory appears); that move must pay for it.
    `tokens`: `message_tokens` of each message, when the caller has them already (policies/path_records.py
    remembers them per node). `foresee`: work out `next_move_from` (only cache markers need it).
    `node_ids`: the path's node ids, which name each prefix of the conversation: the epoch replay
    resumes from where an earlier request with the same prefix left it."""
    state = _Assembly(policy, messages, records, now, provider, encoding, participant, first_move_tokens, tokens,
                      foresee, node_ids)
    out: list[dict[str, Any]] = [dict(m) for m in messages]
    as_sent = list(out)  # a message replaced in `out` is a new object
    decisions: dict[int, Decision] = {}
    sent_tokens: dict[int, int] = {}  # the tokens of a message replaced in `out`, as it is there now
    omissions: Counter[str] = Counter()
    epochs = state.epochs() if policy.enabled else Epochs(0, 0, {}, frozenset())
    boundary, epoch_round, as_of = epochs.boundary, epochs.epoch_round, epochs.as_of
    latest = {i for rnd in state.rounds[-policy.compaction.keep_recent_rounds :] for i in (rnd.assistant, *rnd.tools)}
    trailing = set()  # the results the model is answering now: never marked stale
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") != "tool":
            break
        trailing.add(index)

    results: dict[int, tuple[Decision, Any, str | None, int | None]] = {}
    reuse = decision_reuse.unchanged(state, epochs, latest, trailing) if policy.enabled else None
    previous, dirty = reuse if reuse is not None else (None, set())
    moved_from = f"epoch:{previous.epoch_round}" if previous is not None and previous.epoch_round != epoch_round else None

    def decide(index: int, action: str, reason: str, content: Any = None, artifact: str | None = None,
               kept: str = "", tokens: int | None = None, omission: str | None = None) -> None:
        """`tokens`: the message's tokens with `content`, when known (a memory's are)."""
        if content is not None:
            out[index] = {**out[index], "content": content}
        after = state.tokens[index] if content is None else tokens if tokens is not None \
            else message_tokens(out[index], encoding)
        if content is not None:
            sent_tokens[index] = after
        decisions[index] = Decision(index, str(messages[index].get("role")), action, reason, artifact,
                                    state.tokens[index], after, kept)
        if omission is not None:
            omissions[omission] += 1
        results[index] = (decisions[index], content, omission, after if content is not None else None)

    for index, message in enumerate(messages):
        role = message.get("role")
        view = records.artifacts.get(index)
        if not policy.enabled or role != "tool" or view is None:
            continue
        rnd = state.round_of.get(index, 0)
        if previous is not None and index < previous.length and rnd and index not in dirty \
                and previous.views.get(index) is view:
            found = previous.results.get(index)
            if found is not None:  # decided as the earlier request decided it
                decision, content, omission, after = found
                if content is not None:
                    out[index] = {**out[index], "content": content}
                    sent_tokens[index] = after  # type: ignore[assignment]
                if moved_from is not None and decision.reason == moved_from:
                    decision = Decision(decision.index, decision.role, decision.action, f"epoch:{epoch_round}",
                                        decision.artifact_id, decision.tokens_before, decision.tokens_after,
                                        decision.kept)
                    found = (decision, content, omission, after)
                decisions[index] = decision
                if omission is not None:
                    omissions[omission] += 1
                results[index] = found
            continue
        seen = state.access(index)
        if seen.level == "none":
            decide(index, "withheld", str(seen.reason),
                   render_notice(view, notice_reason(seen, provider)), view.artifact_id, omission=str(seen.omission))
            continue
        if seen.level == "memory":
            text, tokens = state.memory(index)
            decide(index, "compacted", str(seen.reason), text, view.artifact_id, state.kept(index), tokens)
            continue
        stale = state.stale_note(index) if index not in trailing else None
        if index in latest and not stale:
            continue
        in_epoch = rnd <= boundary
        snapshot = as_of.get(rnd, len(state.rounds))
        if replacement := state.superseded_by(index, len(state.rounds)):
            # Correctness, not economy: an older observation never passes for current.
            decide(index, "superseded", f"superseded_by:{replacement}",
                   state.superseded_notice(index, replacement), view.artifact_id, omission="superseded")
            continue
        if (why := state.protected(index, snapshot)) and not stale:
            decide(index, "protected", why, artifact=view.artifact_id)
            continue
        if stale:
            text, tokens = state.memory(index, stale)
            decide(index, "stale", "stale", text, view.artifact_id, state.kept(index, stale), tokens)
            continue
        if in_epoch and index not in epochs.pinned and state.saving(index, snapshot) > 0:
            text, tokens, form = state.compact_form(index)
            decide(index, "compacted", f"epoch:{epoch_round}" if form == "memory" else form, text, view.artifact_id,
                   state.kept(index) if form == "memory" else "", tokens)

    if policy.enabled:
        for rnd in state.rounds[:boundary]:
            if rnd.assistant not in epochs.pinned:
                _compact_call_arguments(state, rnd.assistant, out, decisions, sent_tokens)
        _rehydrate_named(state, out, decisions, sent_tokens)
    if policy.enabled and node_ids is not None and messages:
        last_round = state.rounds[-1] if state.rounds else None
        decision_reuse.DECISIONS.put((node_ids[-1], state.context_key), decision_reuse.Decided(
            len(messages), last_round, last_round.end if last_round else -1, now, dict(records.artifacts),
            frozenset(latest), frozenset(trailing), dict(state.superseder), dict(state.retried_at),
            dict(state.duplicate), boundary, epoch_round, dict(as_of), epochs.pinned, results,
            {i: found for i, found in state._arguments.items() if i < len(messages)}))
    projection_messages = out
    if policy.budget.max_prompt_tokens is not None:
        projection_messages = fit_budget(state, out, decisions, omissions, latest)
    if records.sibling_artifacts:
        omissions["sibling_branch"] += records.sibling_artifacts
    verbatim, tokens_of = Decision.as_is, state.tokens
    for index, message in enumerate(messages):
        if index not in decisions:
            decisions[index] = verbatim(index, str(message.get("role")), tokens_of[index])
    if projection_messages is out:  # nothing omitted: a message forwarded as it came counts as it came
        if policy.budget.max_prompt_tokens is not None:
            sent_tokens.clear()  # fit_budget may have replaced messages again
        forwarded = sum(state.tokens[i] if sent is as_sent[i] else sent_tokens[i] if i in sent_tokens
                        else message_tokens(sent, encoding) for i, sent in enumerate(out))
    else:
        forwarded = sum(message_tokens(m, encoding) for m in projection_messages)
    return Projection(
        messages=projection_messages,
        decisions=tuple(decisions[i] for i in range(len(messages))),
        omissions=dict(sorted(omissions.items())),
        tokens_original=sum(state.tokens),
        tokens_forwarded=forwarded,
        policy_name=policy.name,
        policy_version=policy.version_label,
        boundary_round=boundary,
        epoch_round=epoch_round,
        boundary_index=state.rounds[boundary - 1].end if boundary else -1,
        next_move_from=epochs.upcoming if epochs.upcoming is not None
        and decisions[epochs.upcoming].action == "verbatim" else None,
        next_move_due=epochs.due and epochs.upcoming is not None and decisions[epochs.upcoming].action == "verbatim",
        as_sent=tuple(map(is_, out, as_sent)) if projection_messages is out else (),
    )


_ARTIFACT_ID = re.compile(r"\b(art_[0-9a-f]{20})\b")


def _rehydrate_named(state: _Assembly, out: list[dict[str, Any]], decisions: dict[int, Decision],
                     sent_tokens: dict[int, int]) -> None:
    """Artifacts the latest user message names by id go back in raw, when allowed and within bounds."""
    latest_user = next((m for m in reversed(state.messages) if m.get("role") == "user"), None)
    if latest_user is None:
        return
    text = latest_user.get("content")
    if isinstance(text, list):
        text = " ".join(p.get("text", "") for p in text if isinstance(p, Mapping))
    named = set(_ARTIFACT_ID.findall(text or ""))
    if not named:
        return
    bound = state.policy.rehydration
    for index, view in state.records.artifacts.items():
        decision = decisions.get(index)
        if view.artifact_id not in named or decision is None:
            continue
        if decision.action not in ("compacted", "stale", "superseded") or not state.access(index).raw:
            continue  # withheld stays withheld, a memory-only result stays a memory; verbatim is raw already
        if view.tokens > bound.max_tokens or len(view.content.encode("utf-8", "surrogatepass")) > bound.max_bytes:
            continue
        out[index] = {**out[index], "content": state.policy.redaction.redactor.redact_content(
            state.messages[index].get("content"))}
        sent_tokens.pop(index, None)
        decisions[index] = Decision(index, "tool", "rehydrated", "named_by_user", view.artifact_id,
                                    state.tokens[index], state.tokens[index])


def _compact_call_arguments(state: _Assembly, index: int, out: list[dict[str, Any]],
                            decisions: dict[int, Decision], sent_tokens: dict[int, int]) -> None:
    found = state.compacted_arguments(index)
    if found is not None:
        message, ref, tokens = found
        out[index] = {**out[index], "tool_calls": message["tool_calls"]}
        sent_tokens[index] = tokens  # `message` is the original with these calls, as `out[index]` is now
        decisions[index] = Decision(index, "assistant", "arguments_compacted", "epoch", ref,
                                    state.tokens[index], tokens)
