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

import itertools
import re
from collections import Counter
from operator import is_, not_
from typing import Any, Mapping, Sequence

from policies import decision_reuse
from policies.assembly_state import Assembly
from policies.assembly_types import Decision, Projection, Records
from policies.bounded_cache import BoundedCache
from policies.budget_fit import fit_budget
from policies.epoch_replay import Epochs
from policies.memories import ArtifactView, render_notice
from policies.policy import Policy
from policies.rounds import last_positions
from policies.tokens import DEFAULT_ENCODING, message_tokens
from policies.transcript import SHORT_REF_HEX, refers_to
from policies.visibility import notice_reason

Result = tuple[Decision, Any, "str | None", "int | None"]  # decision, content put in its place, omission, tokens


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
    state = Assembly(policy, messages, records, now, provider, encoding, participant, first_move_tokens, tokens,
                     foresee, node_ids)
    draft = _Draft(state)
    epochs = state.epochs() if policy.enabled else Epochs(0, 0, {}, frozenset())
    latest, trailing = _latest_and_trailing(state)
    if policy.enabled:
        _decide_results(state, draft, epochs, latest, trailing)
        for rnd in state.rounds[:epochs.boundary]:
            if rnd.assistant not in epochs.pinned:
                _compact_call_arguments(state, rnd.assistant, draft.out, draft.decisions, draft.sent_tokens,
                                        draft.omissions)
        _rehydrate_named(state, draft.out, draft.decisions, draft.sent_tokens)
    if policy.enabled and node_ids is not None and messages:
        _remember_decisions(state, draft, epochs, latest, trailing)
    forwarded = draft.out
    if policy.budget.max_prompt_tokens is not None:
        forwarded = fit_budget(state, draft.out, draft.decisions, draft.omissions, latest)
    if records.sibling_artifacts:
        draft.omissions["sibling_branch"] += records.sibling_artifacts
    return _projection(state, draft, epochs, forwarded)


class _Draft:
    """The projection in the making: the messages to forward (a message replaced is a new dict), the
    decisions taken, the tokens of each replacement, the omissions counted, and each tool message's
    decision as the conversation's next request may take it again (`decision_reuse.Decided.results`)."""

    def __init__(self, state: Assembly) -> None:
        self.state = state
        self.out: list[dict[str, Any]] = list(map(dict, state.messages))
        self.as_sent = list(self.out)  # a message replaced in `out` is a new object
        self.decisions: dict[int, Decision] = {}
        self.sent_tokens: dict[int, int] = {}  # the tokens of a message replaced in `out`, as it is there now
        self.omissions: Counter[str] = Counter()
        self.results: dict[int, Result] = {}

    def decide(self, index: int, action: str, reason: str, content: Any = None, artifact: str | None = None,
               kept: str = "", tokens: int | None = None, omission: str | None = None) -> None:
        """`tokens`: the message's tokens with `content`, when known (a memory's are)."""
        state, out = self.state, self.out
        if content is not None:
            out[index] = _with_content(out[index], content)
        after = state.tokens[index] if content is None else tokens if tokens is not None \
            else message_tokens(out[index], state.encoding)
        if content is not None:
            self.sent_tokens[index] = after
        self.decisions[index] = Decision.of(index, str(state.messages[index].get("role")), action, reason, artifact,
                                            state.tokens[index], after, kept)
        if omission is not None:
            self.omissions[omission] += 1
        self.results[index] = (self.decisions[index], content, omission, after if content is not None else None)

    def take_again(self, found: list[tuple[int, Result]]) -> None:
        """Each (index, decision) of `found` as an earlier request of the conversation took it (one loop:
        a 1,000-message request takes some 500 again)."""
        out, sent_tokens, decisions, results = self.out, self.sent_tokens, self.decisions, self.results
        omitted = []
        for index, taken in found:
            decision, content, omission, after = taken
            if content is not None:
                out[index] = _with_content(out[index], content)
                sent_tokens[index] = after  # type: ignore[assignment]
            decisions[index] = decision
            if omission is not None:
                omitted.append(omission)
            results[index] = taken
        self.omissions.update(omitted)


def _with_content(message: dict[str, Any], content: Any) -> dict[str, Any]:
    """`{**message, "content": content}` in a third of the time (a copy of the dict's table, one key set)."""
    replaced = message.copy()
    replaced["content"] = content
    return replaced


def _in_epoch(found: Result, moved_from: str, moved_to: str) -> Result:
    """An earlier request's decision (`found`), its reason naming this request's epoch (`moved_to`) where it
    named the earlier's (`moved_from`)."""
    decision = found[0]
    if decision.reason != moved_from:
        return found
    return (decision.with_reason(moved_to), *found[1:])


def _latest_and_trailing(state: Assembly) -> tuple[set[int], set[int]]:
    """The messages of the latest rounds (`keep_recent_rounds`), and the results the model is answering
    now (never marked stale)."""
    keep = state.policy.compaction.keep_recent_rounds
    latest = {i for rnd in state.rounds[-keep :] for i in (rnd.assistant, *rnd.tools)}
    trailing = set()
    for index in range(len(state.messages) - 1, -1, -1):
        if state.messages[index].get("role") != "tool":
            break
        trailing.add(index)
    return latest, trailing


def _decide_results(state: Assembly, draft: _Draft, epochs: Epochs, latest: set[int], trailing: set[int]) -> None:
    """Each tool result's decision: the conversation's previous request's where nothing it read has
    changed (policies/decision_reuse.py), else decided afresh (`_decide_result`)."""
    reuse = decision_reuse.unchanged(state, epochs, latest, trailing)
    previous, dirty = reuse if reuse is not None else (None, set())
    moved_from = f"epoch:{previous.epoch_round}" if previous is not None \
        and previous.epoch_round != epochs.epoch_round else None
    messages, round_of, count = state.messages, state.round_of, len(state.messages)
    length, views_then, results_then = (previous.length, previous.views, previous.results) if previous is not None \
        else (0, {}, {})
    again: list[tuple[int, Result]] = []  # decided as the earlier request decided them
    for index, view in state.records.artifacts.items():  # the tool messages' views, by index
        if index >= count or messages[index].get("role") != "tool":
            continue
        rnd = round_of.get(index, 0)
        if index < length and rnd and index not in dirty and views_then.get(index) is view:
            found = results_then.get(index)
            if found is not None:
                again.append((index, found))
            continue
        _decide_result(state, draft, index, view, rnd, epochs, latest, trailing)
    if moved_from is not None:
        moved_to = f"epoch:{epochs.epoch_round}"
        again = [(index, _in_epoch(found, moved_from, moved_to)) for index, found in again]
    draft.take_again(again)


def _decide_result(state: Assembly, draft: _Draft, index: int, view: ArtifactView, rnd: int, epochs: Epochs,
                   latest: set[int], trailing: set[int]) -> None:
    """One tool result (of round `rnd`) decided afresh: withheld or a memory as its visibility says,
    superseded, protected, stale, compacted behind the boundary, or left verbatim (no decision)."""
    seen = state.access(index)
    if seen.level == "none":
        draft.decide(index, "withheld", str(seen.reason), render_notice(view, notice_reason(seen, state.provider)),
                     view.artifact_id, omission=str(seen.omission))
        return
    if seen.level == "memory":
        text, tokens = state.memory(index)
        draft.decide(index, "compacted", str(seen.reason), text, view.artifact_id, state.kept(index), tokens)
        return
    stale = state.stale_note(index) if index not in trailing else None
    if index in latest and not stale:
        return
    in_epoch = rnd <= epochs.boundary
    snapshot = epochs.as_of.get(rnd, len(state.rounds))
    if replacement := state.superseded_by(index, len(state.rounds)):
        # Correctness, not economy: an older observation never passes for current.
        draft.decide(index, "superseded", f"superseded_by:{replacement}",
                     state.superseded_notice(index, replacement), view.artifact_id, omission="superseded")
        return
    if (why := state.protected(index, snapshot)) and not stale:
        draft.decide(index, "protected", why, artifact=view.artifact_id)
        return
    if stale:
        text, tokens = state.memory(index, stale)
        draft.decide(index, "stale", "stale", text, view.artifact_id, state.kept(index, stale), tokens)
        return
    if in_epoch and index not in epochs.pinned and state.saving(index, snapshot) > 0:
        text, tokens, form = state.compact_form(index, snapshot)
        draft.decide(index, "compacted", f"epoch:{epochs.epoch_round}" if form == "memory" else form, text,
                     view.artifact_id, state.kept(index, upto=snapshot) if form == "memory" else "", tokens)


def _remember_decisions(state: Assembly, draft: _Draft, epochs: Epochs, latest: set[int], trailing: set[int]) -> None:
    """What this request decided and from what, for the conversation's next request to take again
    (`decision_reuse.unchanged`), by the node id of its last message."""
    messages, last_round = state.messages, state.rounds[-1] if state.rounds else None
    decision_reuse.DECISIONS.put((state.node_ids[-1], state.context_key), decision_reuse.Decided(  # type: ignore[index]
        len(messages), last_round, last_round.end if last_round else -1, state.now, dict(state.records.artifacts),
        frozenset(latest), frozenset(trailing), dict(state.superseder), dict(state.retried_at),
        dict(state.duplicate), epochs.boundary, epochs.epoch_round, dict(epochs.as_of), epochs.pinned, draft.results,
        state.arguments_decided(), state.records.text_chars()))


def _projection(state: Assembly, draft: _Draft, epochs: Epochs, forwarded: list[dict[str, Any]]) -> Projection:
    """The projection of `forwarded` (the draft's messages, or fewer when the budget dropped some): a
    decision for every message (`verbatim` where none was taken) and the tokens it forwards."""
    out, as_sent = draft.out, draft.as_sent
    every = _every_decision(state, draft.decisions)
    same: tuple[bool, ...] = ()
    if forwarded is out:  # nothing omitted: a message forwarded as it came counts as it came
        sent_tokens = draft.sent_tokens
        if state.policy.budget.max_prompt_tokens is not None:
            sent_tokens.clear()  # fit_budget may have replaced messages again
        same = tuple(map(is_, out, as_sent))
        forwarded_tokens = sum(itertools.compress(state.tokens, same)) + sum(
            sent_tokens[i] if i in sent_tokens else message_tokens(out[i], state.encoding)
            for i in itertools.compress(range(len(out)), map(not_, same)))
    else:
        forwarded_tokens = sum(message_tokens(m, state.encoding) for m in forwarded)
    upcoming, boundary = epochs.upcoming, epochs.boundary
    return Projection(
        messages=forwarded,
        decisions=every,
        omissions=dict(sorted(draft.omissions.items())),
        tokens_original=sum(state.tokens),
        tokens_forwarded=forwarded_tokens,
        policy_name=state.policy.name,
        policy_version=state.policy.version_label,
        boundary_round=boundary,
        epoch_round=epochs.epoch_round,
        boundary_index=state.rounds[boundary - 1].end if boundary else -1,
        next_move_from=upcoming if upcoming is not None and every[upcoming].action == "verbatim" else None,
        next_move_due=epochs.due and upcoming is not None and every[upcoming].action == "verbatim",
        as_sent=same,
    )


# Recent projections' decisions, whole, with the indices decided (the rest `verbatim`) and the messages'
# tokens, by (node id of the last message, context): the conversation's next request takes its messages'
# `verbatim` decisions from there (`_every_decision`). A reference per message.
_WHOLE = BoundedCache(128, max_weight=1_000_000, weigh=lambda whole: len(whole[0]))


def _every_decision(state: Assembly, decided: Mapping[int, Decision]) -> tuple[Decision, ...]:
    """A decision for every message: those taken (`decided`), `verbatim` for the others. Where an earlier
    request of the conversation (ending within the last few messages) made them for the same messages and
    tokens, its `verbatim` ones are taken whole and only the rest are made (a 1,000-message request has
    some 600)."""
    messages, tokens, count, ids = state.messages, state.tokens, len(state.messages), state.node_ids
    known = bool(ids) and len(ids) == count  # type: ignore[arg-type]
    every: dict[int, Decision] = {}
    start, made = 0, frozenset[int]()
    for position in last_positions(count) if known else ():
        earlier = _WHOLE.get((ids[position], state.context_key))  # type: ignore[index]
        if earlier is not None:
            if tokens[:position + 1] == earlier[2]:  # the same messages (node ids) and tokens
                start, made = position + 1, earlier[1]
                every = dict(zip(range(start), earlier[0]))
            break
    # `verbatim`: the messages after the earlier request's, and those it decided otherwise and this one not
    for index in itertools.chain(made.difference(decided), range(start, count)):
        if index not in decided:
            every[index] = Decision.as_is(index, str(messages[index].get("role")), tokens[index])
    every.update(decided)
    whole = tuple(map(every.__getitem__, range(count)))
    if known and count:
        _WHOLE.put((ids[-1], state.context_key), (whole, frozenset(decided), list(tokens)))  # type: ignore[index]
    return whole


_ARTIFACT_ID = re.compile(r"\b(art_[0-9a-f]{%d,20})\b" % SHORT_REF_HEX)  # a full id or a short reference


def _rehydrate_named(state: Assembly, out: list[dict[str, Any]], decisions: dict[int, Decision],
                     sent_tokens: dict[int, int]) -> None:
    """Artifacts the latest user message names by id go back in raw, when allowed and within bounds; so
    do those a model had back whole through the rehydration tool on an earlier request (it needed more
    than the memory: hiding it again would have it ask again, round after round), unless stale or
    superseded since."""
    latest_user = state.latest_user_message()
    named: set[str] = set()
    if latest_user is not None:
        text = latest_user.get("content")
        if isinstance(text, list):
            text = " ".join(p.get("text", "") for p in text if isinstance(p, Mapping))
        named = set(_ARTIFACT_ID.findall(text or ""))
    back = state.records.rehydrated
    if not named and not back:
        return
    bound = state.policy.rehydration
    for index, view in state.records.artifacts.items():
        decision = decisions.get(index)
        if decision is None:
            continue
        if any(refers_to(ref, view.artifact_id) for ref in named):
            reason = "named_by_user"
            if decision.action not in ("compacted", "stale", "superseded"):
                continue
        elif view.artifact_id in back:
            reason = "rehydrated_before"
            if decision.action != "compacted":
                continue  # a stale or superseded one is marked as such: correctness first
        else:
            continue
        if not state.access(index).raw:
            continue  # withheld stays withheld, a memory-only result stays a memory; verbatim is raw already
        if view.tokens > bound.max_tokens or len(view.content.encode("utf-8", "surrogatepass")) > bound.max_bytes:
            continue
        out[index] = {**out[index], "content": state.policy.redaction.redactor.redact_content(
            state.messages[index].get("content"))}
        sent_tokens.pop(index, None)
        decisions[index] = Decision(index, "tool", "rehydrated", reason, view.artifact_id,
                                    state.tokens[index], state.tokens[index])


def _compact_call_arguments(state: Assembly, index: int, out: list[dict[str, Any]], decisions: dict[int, Decision],
                            sent_tokens: dict[int, int], omissions: Counter[str]) -> None:
    """An old round's assistant turn with its long call arguments compacted and its prose cut to a
    note (`Assembly.compacted_arguments`): `arguments_compacted` when arguments were, else
    `thought_compacted`; the prose cut is counted as an `assistant_thought` omission."""
    found = state.compacted_arguments(index)
    if found is not None:
        message, ref, tokens, thought_chars = found
        out[index] = replaced = out[index].copy()
        replaced["tool_calls"] = message["tool_calls"]
        kept = ""
        if thought_chars:
            out[index]["content"] = message["content"]
            kept = f"reasoning: {thought_chars} chars omitted"
            omissions["assistant_thought"] += 1
        sent_tokens[index] = tokens  # `message` is the original with these calls and content, as `out[index]` is now
        decisions[index] = Decision.of(index, "assistant", "arguments_compacted" if ref else "thought_compacted",
                                       "epoch", ref, state.tokens[index], tokens, kept)
