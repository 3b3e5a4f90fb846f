"""The working state of one assembly (`Assembly`): the facts about each tool result that the
assembler's decisions read (what supersedes, retries or repeats it, who may see it, whether it is
stale or protected, its memory and what compacting it saves), each worked out once per request and,
where it is a function of the conversation's prefix, remembered across its requests by node id.

policies/assembler.py makes one per request and decides from it; the epoch replay
(policies/epoch_replay.py) is mixed in.
"""
from __future__ import annotations

import operator
from dataclasses import replace
from typing import Any, Mapping, NamedTuple, Sequence

from policies import decision_reuse
from policies.assembly_types import Records
from policies.bounded_cache import BoundedCache, views_cache
from policies.epoch_replay import EpochReplay, Tallies
from policies.excerpts import Kept, phrases_of, terms_of
from policies.memories import compact_arguments, excerpt, holds, kept_summary, render_memory, terms_in, text_free
from policies.policy import Policy, ToolRule
from policies.result_facts import loose_digest, short_values, shown_revision
from policies.rounds import last_positions, rounds_and_numbers
from policies.supersession import Scan, extend, revisions, scan
from policies.thoughts import compact_thought
from policies.tokens import count_text, message_tokens
from policies.transcript import short_ref, user_words
from policies.visibility import Access, access

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

# What the conversation named of one result (`Assembly.salience_terms`): its terms, those a user turn
# asked about, and the quoted terms and paths a user turn named that it holds.
Named = tuple[frozenset[str], frozenset[str], frozenset[str]]
_PHRASES_BOUND = 256  # quoted terms and paths remembered per conversation (each is looked for in every result)
_NOTHING_NAMED: Named = (frozenset(), frozenset(), frozenset())


class _Earlier(NamedTuple):
    """What `Assembly._index_duplicates` found for a request, and the superseders and retries: the next
    request of the conversation looks at its new results alone."""

    length: int  # the request's messages
    views: dict[int, Any]  # the records' views it read, by index
    duplicate: dict[int, tuple[int, bool]]
    exact: dict[str, tuple[int, ...]]  # the ok outputs seen, by digest
    loose: dict[str, tuple[int, ...]]  # and by digest blind to timestamps and timings
    later: Scan
    chars: int  # the text the views hold (`Records.text_chars`): what the entry weighs


# `_Earlier` by (node id of its last message, context). Not mutated once stored. The views hold the
# results' texts: a bounded share of them.
_DUPLICATES = views_cache(lambda found: found.chars)


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _lines_shown(lines: Sequence[Kept]) -> tuple[frozenset[int], frozenset[int]]:
    """The artifact lines an excerpt shows, and those it keeps because a user turn asked about them."""
    shown = frozenset(n for k in lines if k.number for n in range(k.number, max(k.number, k.through) + 1))
    return shown, frozenset(k.number for k in lines if k.number and k.why.split("+")[0] == "asked")


class Assembly(EpochReplay):
    """The working state of one assembly; `assemble` (policies/assembler.py) is the only maker of one."""

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
        self._memory_cache: dict[tuple[Any, ...], tuple[str, int, str, tuple[frozenset[int], frozenset[int]]]] = {}
        self._rules: dict[int, ToolRule] = {}
        self._restricted: dict[int, bool] = {}
        self._savings: dict[tuple[int, str | None, str | None], int] = {}
        # A saving reads owners (through which earlier duplicates the requester may see raw) only under
        # rules that show results to some participants alone: shared by node id when none does.
        self._share_savings = node_ids is not None and all(r.visibility == "conversation" for r in policy.tools)
        earlier = self._earlier_request()
        artifacts = records.artifacts
        found = scan(artifacts, self.rule) if earlier is None else extend(earlier.later, artifacts, self.rule)
        self.superseder, self.retried_at, self.revision = found.superseder, found.retried_at, {}
        if any(r.revision_on for r in policy.tools):  # (which sets superseders of its own: in a copy)
            self.superseder = dict(found.superseder)
            self.revision = revisions(artifacts, self.rule, self.superseder)
        self._index_duplicates(earlier, found)
        self._first_named: dict[str, int] | None = None  # term -> where a user turn or call first named it
        self._arguments: dict[int, tuple[dict[str, Any], str | None, int, int] | None] = {}
        # what the decision loop of the conversation's latest earlier request decided (see `unchanged`)
        self.previous: decision_reuse.Decided | None = None
        if node_ids and messages:
            for position in last_positions(len(messages)):
                self.previous = decision_reuse.DECISIONS.get((node_ids[position], self.context_key))
                if self.previous is not None:
                    self._arguments = dict(self.previous.arguments)
                    break
        self._tally: Tallies | None = None  # `EpochReplay._tallies`

    # -- facts about one tool message, as of a snapshot (rounds <= upto) ---------

    def rule(self, index: int) -> ToolRule:
        if index not in self._rules:
            view = self.records.artifacts.get(index)
            self._rules[index] = self.policy.rule_for(view.tool_name if view else None)
        return self._rules[index]

    def _index_duplicates(self, earlier: _Earlier | None, later: Scan) -> None:
        """For each ok result, the first earlier ok result with the same output (or the same apart
        from timestamps and timings) that the requester may see raw; from what `earlier` found
        (`_earlier_request`), then remembered with it and `later` (the superseders and retries) for the
        conversation's next request."""
        self.duplicate: dict[int, tuple[int, bool]] = {}  # index -> (earlier index, exact)
        exact: dict[str, tuple[int, ...]] = {}
        loose: dict[str, tuple[int, ...]] = {}
        artifacts, start = self.records.artifacts, 0
        if earlier is not None:
            start = earlier.length
            self.duplicate, exact, loose = dict(earlier.duplicate), dict(earlier.exact), dict(earlier.loose)
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
                            _Earlier(len(self.messages), dict(artifacts), self.duplicate, exact, loose, later,
                                     self.records.text_chars()))

    def _earlier_request(self) -> _Earlier | None:
        """What `_index_duplicates` found and remembered for the latest earlier request of this
        conversation (ending within the last few messages), when every view it read is the one this
        request has: which earlier output a repeat refers to, and which later result supersedes or
        retries one, read only those views (whom each may be shown to, each one's call) and the context."""
        if not self.node_ids or not self.messages:
            return None
        for position in last_positions(len(self.messages)):
            found = _DUPLICATES.get((self.node_ids[position], self.context_key))
            if found is not None:
                length, views = found.length, found.views
                artifacts = self.records.artifacts
                # (counted and compared without a Python step per view: a 1,000-message request has ~300)
                if sum(map(length.__gt__, artifacts)) != len(views) or \
                        not all(map(operator.is_, map(artifacts.get, views), views.values())):
                    return None
                return found
        return None

    def _first_seen(self, candidates: Sequence[int]) -> int | None:
        """The first of `candidates` the requester may see raw (checked only when a duplicate is found)."""
        return next((i for i in candidates if self.access(i).raw and not self.restricted(i)), None)

    def salience_terms(self, index: int, upto: int | None = None) -> Named:
        """What the conversation had named of result `index` (its terms, those a user turn asked about,
        and the quoted terms and paths a user turn named that it holds) before the end of round `upto`
        (the round count its memory renders as of: up to the next round's call, the request's end when
        there is none yet), or before the result itself when `upto` is None. Only what came before a
        fixed point, so a memory renders the same on every later request; the memory of an epoch's
        move follows the question asked by then (and `EpochReplay._question_refresh` re-renders the
        older ones a new question needs). Nothing when the policy's `follow_conversation` is off."""
        if not self.c.follow_conversation:
            return _NOTHING_NAMED
        if self._first_named is None:
            self._first_named = self._named_terms()
        terms, asked, phrases = self._first_named
        if not terms and not phrases:
            return _NOTHING_NAMED
        bound = index if upto is None else self.rounds[upto].assistant if upto < len(self.rounds) else len(self.messages)
        never = len(self.messages)
        view = self.records.artifacts[index]
        named = frozenset(t for t in terms_in(view) if terms.get(t, never) < bound)
        return (named, frozenset(t for t in named if asked.get(t, never) < bound),
                frozenset(p for p, at in phrases.items() if at < bound and holds(view, p)))

    def _named_terms(self) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """Where a user turn or call first named each term, where a user turn first named each, and
        where one first named each quoted term or path: extends what an earlier request of the
        conversation found in its messages (by the node id of its last, which names them all)."""
        start, terms, asked, phrases = 0, {}, {}, {}
        if self.node_ids:
            for position in last_positions(len(self.messages)):
                found = _NAMED_TERMS.get(self.node_ids[position])
                if found is not None:
                    start, terms, asked, phrases = position + 1, dict(found[0]), dict(found[1]), dict(found[2])
                    break
        for position in range(start, len(self.messages)):
            message = self.messages[position]
            if message.get("role") == "user":
                text = user_words(message)
                for phrase in phrases_of(text):
                    if len(phrases) < _PHRASES_BOUND:
                        phrases.setdefault(phrase, position)
                for term in terms_of(text):
                    asked.setdefault(term, position)
                    terms.setdefault(term, position)
            elif message.get("role") == "assistant" and message.get("tool_calls"):
                text = " ".join(short_values(arguments) for c in message["tool_calls"] if isinstance(c, Mapping)
                                and isinstance(arguments := (c.get("function") or {}).get("arguments"), str))
                for term in terms_of(text):
                    terms.setdefault(term, position)
        if self.node_ids and start < len(self.messages):
            _NAMED_TERMS.put(self.node_ids[-1], (terms, asked, phrases))
        return terms, asked, phrases

    def compacted_arguments(self, index: int) -> tuple[dict[str, Any], str | None, int, int] | None:
        """The assistant message at `index` with its long call arguments compacted and the prose it
        wrote beside its calls cut to a note (policies/thoughts.py), the first artifact its arguments
        name (None: only the prose was cut), its tokens and the prose characters omitted (None:
        nothing to compact)."""
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
        thought = None
        if calls and self.c.thought_min_tokens is not None:
            thought = compact_thought(message.get("content"), self.c.thought_min_tokens, self.encoding)
        found = None
        if changed or thought:
            compacted = {**message, "tool_calls": calls}
            if thought:
                compacted["content"] = thought[0]
            found = (compacted, changed[0] if changed else None, message_tokens(compacted, self.encoding),
                     thought[1] if thought else 0)
        self._arguments[index] = found
        return found

    def arguments_decided(self) -> dict[int, tuple[dict[str, Any], str | None, int, int] | None]:
        """Every `compacted_arguments` worked out so far (this request's or taken from the previous
        one's), for the conversation's next request (`decision_reuse.Decided.arguments`)."""
        arguments, count = self._arguments, len(self.messages)
        if not arguments or max(arguments) < count:  # a copy (a branch back to fewer messages drops some)
            return dict(arguments)
        return {i: found for i, found in arguments.items() if i < count}

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

    def memory(self, index: int, stale: str | None = None, upto: int | None = None) -> tuple[str, int]:
        """The memory of result `index`, as of round `upto` (see `salience_terms`)."""
        text, tokens, _, _ = self._memory(index, stale, upto)
        return text, tokens

    def reveals(self, index: int, before: int, upto: int) -> bool:
        """Whether the memory of `index` as of round `upto` shows a line a user turn asked about that
        its memory as of round `before` leaves out."""
        then, now = self.salience_terms(index, before), self.salience_terms(index, upto)
        if then[1:] == now[1:]:
            return False  # nothing more asked about
        shown, asked = self._memory(index, None, before)[3], self._memory(index, None, upto)[3]
        return bool(asked[1] - shown[0])

    def kept(self, index: int, stale: str | None = None, upto: int | None = None) -> str:
        """Which lines the memory of `index` kept, and why (for the assembly record)."""
        return self._memory(index, stale, upto)[2]

    def _memory(self, index: int, stale: str | None, upto: int | None
                ) -> tuple[str, int, str, tuple[frozenset[int], frozenset[int]]]:
        terms = self.salience_terms(index, upto)
        key = (index, stale, terms)
        if key in self._memory_cache:
            return self._memory_cache[key]
        node_key = (self.node_ids[index], self.policy.fingerprint, self.encoding, stale, terms) \
            if self.node_ids is not None else None
        if node_key is not None and (found := _NODE_MEMORIES.get(node_key)) is not None:
            self._memory_cache[key] = found
            return found
        view = self.records.artifacts[index]
        shared_key = (self.policy.fingerprint, self.encoding, text_free(view), stale, terms)
        found = _RENDERED.get(shared_key)
        if found is None:
            # Redacted before the excerpt is taken: a secret cut in two by a line's clipping
            # would no longer be recognised.
            redacted = self.policy.redaction.redactor.redact(view.content)
            shown = replace(view, content=redacted.text) if redacted.counts else view
            lines = excerpt(shown, self.rule(index), self.c, *terms)
            text = render_memory(shown, self.rule(index), self.c, stale, lines=lines)
            found = (text, message_tokens({**self.messages[index], "content": text}, self.encoding),
                     kept_summary(lines, redacted.counts), _lines_shown(lines))
            _RENDERED.put(shared_key, found)
        if node_key is not None:
            _NODE_MEMORIES.put(node_key, found)
        self._memory_cache[key] = found
        return self._memory_cache[key]

    def superseded_notice(self, index: int, replacement: str) -> str:
        view = self.records.artifacts[index]
        later = self.superseder[index]
        if self.revision.get(index) is not None and self.revision.get(later) is not None:
            return (f"[superseded tool result artifact:{short_ref(view.artifact_id)} (revision "
                    f"{shown_revision(self.revision[index])}): replaced by revision "
                    f"{shown_revision(self.revision[later])}, artifact:{short_ref(replacement)}]")
        return f"[superseded tool result artifact:{short_ref(view.artifact_id)}: replaced by artifact:{short_ref(replacement)}]"

    def duplicate_notice(self, index: int) -> tuple[str, int] | None:
        """The reference that stands in for a repeated output, and its tokens (None: not a duplicate)."""
        if index not in self.duplicate:
            return None
        earlier, exact = self.duplicate[index]
        view, first = self.records.artifacts[index], self.records.artifacts[earlier]
        same = "the same output" if exact else "the same output apart from timestamps and timings"
        text = (f"[duplicate tool result artifact:{short_ref(view.artifact_id)}: {same} as "
                f"artifact:{short_ref(first.artifact_id)}]")
        return text, message_tokens({**self.messages[index], "content": text}, self.encoding)

    def compact_form(self, index: int, upto: int) -> tuple[str, int, str]:
        """(content, tokens, reason) of an old result compacted as of round `upto`: a reference to its
        earlier duplicate, or its memory."""
        if (notice := self.duplicate_notice(index)) is not None and notice[1] < self.tokens[index]:
            earlier = self.records.artifacts[self.duplicate[index][0]].artifact_id
            return notice[0], notice[1], f"duplicate_of:{earlier}"
        text, tokens = self.memory(index, upto=upto)
        return text, tokens, "memory"

    def saving(self, index: int, upto: int) -> int:
        """Tokens saved by rendering this result as of round `upto` instead of verbatim."""
        # It depends on `upto` only through these three facts: memoise on them.
        key = (index, self.superseded_by(index, upto), self.protected(index, upto), self.salience_terms(index, upto))
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
        _, tokens, reason = self.compact_form(index, upto)
        if small and reason == "memory":
            return 0
        return max(0, self.tokens[index] - tokens)

