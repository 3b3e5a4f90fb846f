"""Where the epoch boundary is: the replay of a conversation's requests, one per completed round,
that moves the boundary when a move pays for itself, resumed across requests (see `EpochReplay.epochs`)."""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from policies.bounded_cache import BoundedCache
from policies.rounds import last_positions


@dataclass
class Window:
    """The savings of the messages a move would compact, with their sum and the first that saves."""

    upto: int  # rounds before this one are in the window (or behind the boundary)
    values: dict[int, int] = field(default_factory=dict)
    total: int = 0
    _saving: list[int] = field(default_factory=list)  # a heap of indices, some no longer saving

    def put(self, index: int, saving: int) -> None:
        self.total += saving - self.values.get(index, 0)
        self.values[index] = saving
        if saving > 0:
            heapq.heappush(self._saving, index)

    def first(self) -> int | None:
        while self._saving and self.values.get(self._saving[0], 0) <= 0:
            heapq.heappop(self._saving)
        return self._saving[0] if self._saving else None


@dataclass(frozen=True)
class Epochs:
    boundary: int  # rounds up to this one are behind the boundary
    epoch_round: int  # the round count at which the boundary last moved
    as_of: dict[int, int]  # compacted round -> the round count it is rendered as of
    pinned: frozenset[int]  # messages behind the boundary that a move left verbatim
    upcoming: int | None = None  # the first message the next move is expected to change
    due: bool = False  # the next request is expected to make that move


@dataclass
class Replay:
    """The epoch replay's state after round `t` (see `EpochReplay.epochs`)."""

    t: int
    boundary: int
    epoch_round: int
    compacted_at: dict[int, int]  # round number -> the round count whose move compacted it
    refreshed: int  # the latest refresh re-rendered every round compacted by then
    window: Window
    pinned: set[int]  # messages a move left verbatim for good: compacting them never paid

    def copy(self) -> "Replay":
        window = Window(upto=self.window.upto, values=dict(self.window.values), total=self.window.total,
                         _saving=list(self.window._saving))
        return Replay(self.t, self.boundary, self.epoch_round, dict(self.compacted_at), self.refreshed, window,
                       set(self.pinned))


class Tallies(NamedTuple):
    """What `_requests_before` and `_next_round_likely` count of a request's messages: the assistant
    messages before each index (one more entry than messages), and [answers, calls among them] of the
    assistant messages after anything but a tool result ([0]) and after a tool result ([1]); and the index
    of the latest user message (-1: none)."""

    assistants: list[int]
    answers: list[list[int]]
    latest_user: int


# Tallies by the node id of the last message counted (a function of the messages up to it): the
# conversation's next request counts its new messages alone. A few ints per message.
_TALLIES = BoundedCache(512, max_weight=2_000_000, weigh=lambda tallies: len(tallies.assistants))

# Replays by (node id at a round's end, context): a conversation's next request resumes where its
# previous one left off instead of replaying every round again. Pure: a state is a function of its key.
# One entry per request, holding a few small ints per round: 512 conversations stay resumable (about
# 20 MB at worst, for 500-round conversations); a conversation that fell out replays in full once.
_REPLAYS = BoundedCache(512)
_RESUME_LOOKBACK = 4

_START_CANDIDATES = 64  # where a move may start: the first this many messages of the window that save


def _spans(tokens: Sequence[int]) -> Callable[[int, int], int]:
    """`span(first, last)`: the tokens of messages `first` to `last` (0 when `last` < `first`)."""
    prefix = list(itertools.accumulate(tokens, initial=0))

    def span(first: int, last: int) -> int:
        return prefix[last + 1] - prefix[first] if last >= first else 0

    return span


@dataclass(frozen=True)
class _Links:
    """Rounds at which later results change earlier ones' savings. A compacted result renders
    differently later only when a retry resolves its failure (supersession is applied whatever the
    epoch), so refreshes are considered at those rounds alone: linear in the conversation's length."""

    retries: dict[int, list[int]]  # round -> failed results a result of that round retries
    changes_at: dict[int, list[int]]  # round -> results whose saving it changes
    superseded_at: dict[int, list[int]]  # round -> results a result of that round supersedes

    @classmethod
    def of(cls, superseder: Mapping[int, int], retried_at: Mapping[int, int], round_of: Mapping[int, int],
           first: int, last: int) -> "_Links":
        """The links at rounds `first` to `last` only: those the replay steps through (a conversation's
        next request resumes the replay and steps through its new round alone, a resend through none)."""
        retries: dict[int, list[int]] = {}
        changes_at: dict[int, list[int]] = {}
        superseded_at: dict[int, list[int]] = {}
        if first > last:
            return cls(retries, changes_at, superseded_at)
        for failed, retry in retried_at.items():
            if first <= (rnd := round_of[retry]) <= last:
                retries.setdefault(rnd, []).append(failed)
        for earlier, later in superseder.items():
            if first <= (rnd := round_of.get(later, 0)) <= last:
                changes_at.setdefault(rnd, []).append(earlier)
                superseded_at.setdefault(rnd, []).append(earlier)
        for earlier, later in retried_at.items():
            if first <= (rnd := round_of.get(later, 0)) <= last:
                changes_at.setdefault(rnd, []).append(earlier)
        return cls(retries, changes_at, superseded_at)


class EpochReplay:
    """The epoch replay of policies/assembly_state.py's `Assembly`, which it is mixed into: it reads the
    assembly's rounds, token counts, savings, supersessions and retries, and the compaction settings."""

    def _requests_before(self, t: int) -> int:
        """Requests the client made up to round `t`'s assistant message: one per assistant message."""
        assistants = self._tallies().assistants
        if t > len(self.rounds):  # the next request: one more
            return assistants[-1] + 1
        return assistants[self.rounds[t - 1].assistant + 1]

    def latest_user_message(self) -> Mapping[str, Any] | None:
        """The latest user message, if any (`Tallies.latest_user`)."""
        index = self._tallies().latest_user
        return self.messages[index] if index >= 0 else None

    def _tallies(self) -> Tallies:
        """The messages' `Tallies`, from those of the longest prefix an earlier request of the conversation
        counted (within the last few messages) and the messages after it."""
        if self._tally is not None:
            return self._tally
        messages, ids = self.messages, self.node_ids
        known = ids is not None and len(ids) == len(messages)
        start, assistants, answers, latest_user = 0, [0], [[0, 0], [0, 0]], -1
        for position in last_positions(len(messages)) if known else ():
            found = _TALLIES.get(ids[position])  # type: ignore[index]
            if found is not None:
                start, assistants, answers = position + 1, list(found.assistants), [list(a) for a in found.answers]
                latest_user = found.latest_user
                break
        for index in range(start, len(messages)):
            message = messages[index]
            role = message.get("role")
            assistants.append(assistants[-1] + (role == "assistant"))
            if role == "assistant" and index:
                tally = answers[messages[index - 1].get("role") == "tool"]
                tally[0] += 1
                tally[1] += bool(message.get("tool_calls"))
            elif role == "user":
                latest_user = index
        self._tally = Tallies(assistants, answers, latest_user)
        if known and start < len(messages):
            _TALLIES.put(ids[-1], self._tally)  # type: ignore[index]
        return self._tally

    def _pays(self, saving: int, resent: int, t: int) -> bool:
        """Whether reading `saving` fewer tokens on later turns outweighs re-sending `resent` once, at the
        request that follows round `t`: later turns are taken to number `horizon` times the requests so
        far (one per assistant message; a conversation with user turns between rounds has more of them)."""
        c = self.c
        later_turns = c.horizon * self._requests_before(t)
        return saving * c.cache_read_price * later_turns >= resent * (c.cache_write_price - c.cache_read_price)

    def epochs(self) -> Epochs:
        """Where the boundary is, since which round, as of which round each compacted round is
        rendered, and which messages behind it stay verbatim.

        Replays the conversation's history of requests, one per completed round t:
        the boundary moves past rounds that left the verbatim window when the
        un-compacted tail is past `trigger_tokens` and the move pays for itself
        (it saves at least `clear_at_least_tokens`, and what it saves on later
        turns outweighs what it makes the provider read afresh: see `_best_start`,
        which also says where in the window the move starts). A compacted
        round is rendered as of the round count in `as_of`; it is
        re-rendered with later knowledge (a retry resolving its failure) only
        when that refresh pays for itself too.
        Between moves every rendering is unchanged, so each request extends the
        previous one and the provider's prefix cache keeps hitting.
        """
        span = _spans(self.tokens)
        r = self._resumed_replay()  # the replay as an earlier request of this conversation left it
        links = _Links.of(self.superseder, self.retried_at, self.round_of, r.t + 1, len(self.rounds))
        for t in range(r.t + 1, len(self.rounds) + 1):
            # the previous request ended just before round t's assistant message: the rounds before it
            # and whatever prose and user turns followed them
            previous_end = self.rounds[t - 1].assistant - 1
            self._question_refresh(r, t - 1)
            self._refresh(r, t, links.retries.get(t, ()), span, previous_end)
            self._move(r, t, links, span, previous_end)
        r.t = len(self.rounds)
        self._remember_replay(r)
        if self._asks_after(r.t):  # a question after the latest round: not the replay's state at that round
            r = r.copy()
            self._question_refresh(r, r.t)
        as_of = {number: max(t, r.refreshed) for number, t in r.compacted_at.items()} if r.refreshed \
            else dict(r.compacted_at)  # rounds are counted from 1: max(t, 0) is t
        upcoming, due = self._upcoming(r.window, r.boundary, span, self._move_saving) if self.foresee else (None, False)
        return Epochs(r.boundary, r.epoch_round, as_of, frozenset(r.pinned), upcoming, due)

    def _asks_after(self, t: int) -> bool:
        """Whether a user turn follows round `t` (before the next round's call, or the request's end)."""
        if t == 0:
            return False
        end = self.rounds[t].assistant if t < len(self.rounds) else len(self.messages)
        return any(self.messages[p].get("role") == "user" for p in range(self.rounds[t - 1].end + 1, end))

    def _question_refresh(self, r: Replay, t: int) -> None:
        """Re-render what is compacted as of round `t` when a user turn after round `t` asks about a line
        a memory rendered earlier leaves out: correctness, not economy (the model is asked about what it
        would otherwise see only as an artifact id), though it breaks the prefix at the first memory
        that changes. A memory renders as of the question only through this and a move (`salience_terms`)."""
        if r.boundary == 0 or r.refreshed >= t or not self._asks_after(t):
            return
        for number in range(1, r.boundary + 1):
            then = max(r.compacted_at.get(number, 0), r.refreshed)
            if then >= t:
                continue
            for i in self.rounds[number - 1].tools:
                if i in self.records.artifacts and i not in r.pinned and not self.superseded_by(i, t) \
                        and self.reveals(i, then, t):
                    r.refreshed = t
                    return

    def _move_saving(self, i: int, t: int) -> int:
        """What compacting result `i` saves at round `t`; a superseded one is a notice at any boundary."""
        return 0 if self.superseded_by(i, t) else self.saving(i, t)

    def _refresh(self, r: Replay, t: int, retried: Iterable[int], span: Callable[[int, int], int],
                 previous_end: int) -> None:
        """Step 1 of round `t`: re-render what is compacted already (`r.refreshed`), if the newer
        knowledge of the results a retry at `t` resolved (`retried`) saves enough."""
        gains = {}
        for i in retried:
            number = self.round_of[i]
            if number > r.boundary or self.superseded_by(i, t):
                continue
            gain = self.saving(i, t) - self.saving(i, max(r.compacted_at[number], r.refreshed))
            if gain > 0:
                gains[i] = gain
        if gains:
            first = min(gains)
            resent = span(first, previous_end) - sum(
                self.saving(i, t) for i in range(first, previous_end + 1)
                if i in self.records.artifacts and self.round_of.get(i, 0) <= r.boundary and i not in r.pinned
            )
            if self._pays(sum(gains.values()), max(0, resent), t):
                r.refreshed = t

    def _move(self, r: Replay, t: int, links: _Links, span: Callable[[int, int], int], previous_end: int) -> None:
        """Step 2 of round `t`: move the boundary past the rounds that left the verbatim window, when the
        tail is past `trigger_tokens` and a start pays (`_best_start`)."""
        eligible = t - self.c.keep_recent_rounds
        if eligible <= r.boundary:
            return
        # What a move would save: the rounds between the boundary and `eligible`, their results
        # and their long call arguments, kept current as rounds join and as later results
        # supersede or retry them (the only facts that change a saving as t grows).
        window = r.window
        for rnd in self.rounds[window.upto:eligible]:
            for i in rnd.tools:
                window.put(i, self._move_saving(i, t))
            window.put(rnd.assistant, self.argument_saving(rnd.assistant))
        window.upto = eligible
        for i in links.changes_at.get(t, ()):
            if i in window.values:
                window.put(i, self._move_saving(i, t))
        tail = span(self.rounds[r.boundary].assistant, self.rounds[t - 1].end)
        if tail < self.c.trigger_tokens:
            return
        if window.first() is None:
            return
        # the first message that changes at round t whatever the boundary does (superseded now)
        forced = min((i for i in links.superseded_at.get(t, ()) if self.round_of.get(i, 0) <= eligible),
                     default=previous_end + 1)
        start = self._best_start(window, span, forced, t, self.first_move_tokens if r.boundary == 0 else 0)
        if start is not None:
            r.pinned.update(i for i, v in window.values.items() if v > 0 and i < start)
            for number in range(r.boundary + 1, eligible + 1):
                r.compacted_at[number] = t
            r.boundary, r.epoch_round = eligible, t
            r.window = Window(upto=eligible)

    # -- the replay, resumed across requests ------------------------------------

    def _replay_key(self, t: int) -> tuple[Any, ...] | None:
        """What the replay's state after round `t` is a function of: the messages up to that round's end
        (named by the node id of its last message) and everything else the savings read."""
        if self.node_ids is None or t == 0:
            return None
        return (self.node_ids[self.rounds[t - 1].end], self.context_key)

    def _resumed_replay(self) -> Replay:
        """The replay's state after the latest round an earlier request of this conversation replayed
        (looked for at the last few rounds: an agent adds one or two per request), or a fresh one."""
        for t in range(len(self.rounds), max(0, len(self.rounds) - _RESUME_LOOKBACK), -1):
            key = self._replay_key(t)
            found = _REPLAYS.get(key) if key is not None else None
            if found is not None:
                return found.copy()
        return Replay(t=0, boundary=0, epoch_round=0, compacted_at={}, refreshed=0, window=Window(upto=0),
                       pinned=set())

    def _remember_replay(self, replay: Replay) -> None:
        key = self._replay_key(replay.t)
        if key is not None and _REPLAYS.get(key) is None:
            _REPLAYS.put(key, replay.copy())

    def _upcoming(self, window: Window, boundary: int, span: Callable[[int, int], int],
                  move_saving: Callable[[int, int], int]) -> tuple[int | None, bool]:
        """The first message the next move is expected to change: where it would start if the
        conversation went on with one more round (as known now), else the first message of the window
        that would save. Cache markers go just before it (gateway/pipeline/cache_markers.py), so the move reads
        what precedes it from the provider's cache. And whether that move is due at the next request:
        it pays with one more round, and that round is likely enough (`_next_round_likely`) for the
        markers to leave what the move rewrites uncached."""
        t = len(self.rounds) + 1
        eligible = t - self.c.keep_recent_rounds
        for rnd in self.rounds[window.upto:max(window.upto, eligible)]:
            for i in rnd.tools:
                window.put(i, move_saving(i, t - 1))
            window.put(rnd.assistant, self.argument_saving(rnd.assistant))
        if window.first() is None:
            return None, False
        start = self._best_start(window, span, len(self.messages), t,
                                 self.first_move_tokens if boundary == 0 else 0)
        return (start, self._next_round_likely()) if start is not None else (window.first(), False)

    def _next_round_likely(self) -> bool:
        """Whether the model's answer to this request is likely enough to be another tool call (the round
        that makes the foreseen move) for the cache markers to leave what the move rewrites uncached.

        Caching a prompt's tail costs `cache_write_price` instead of 1 for those tokens; when the next
        request moves, the tail is never read, and the write was wasted. When it does not (the model
        answers in prose, the user speaks), the next request must write the tail at `cache_write_price`
        where it would have read it at `cache_read_price`. Leaving it uncached pays when the chance p of
        a round satisfies (write - 1) >= (1 - p) (write - read). p is how often the model answered the
        same kind of turn (tool results, or anything else) with a call so far in this conversation,
        counted with one call and one answer without for what has not been seen (Laplace's rule)."""
        c = self.c
        if c.cache_write_price <= 1 or c.cache_write_price <= c.cache_read_price:
            return False
        after_results = bool(self.messages) and self.messages[-1].get("role") == "tool"
        answers, calls = self._tallies().answers[after_results]
        odds = (calls + 1) / (answers + 2)
        return (c.cache_write_price - 1) >= (1 - odds) * (c.cache_write_price - c.cache_read_price)

    def _best_start(self, window: Window, span: Callable[[int, int], int], forced: int, t: int,
                    added: int = 0) -> int | None:
        """Where a move at round `t` should start compacting (None: no move pays).

        A move compacts the window's messages from its start on; the provider reads afresh
        what follows the start, up to `forced` (a message that changes now whatever the boundary
        does: from there on the move only makes it read less). Starting later leaves the
        messages before the start verbatim for good, and pays when what they would save is
        small next to what breaking the prefix there costs (a short call argument early in a
        long round, say). A move pays when what it saves on later requests, taken to number
        `horizon` times the requests so far, outweighs what it makes the provider read afresh.
        `added`: tokens the move adds to the prompt for good (the rehydration tool, declared where the
        first memory appears: see `assemble`), written once and read on every later request."""
        c = self.c
        items = sorted((i, v) for i, v in window.values.items() if v > 0)[:_START_CANDIDATES]
        so_far = self._requests_before(t)
        past_forced = sum(v for i, v in window.values.items() if i >= forced)
        rewrite = c.cache_write_price - c.cache_read_price
        addition = added * (c.cache_write_price + c.cache_read_price * c.horizon * so_far)
        best, best_value = None, 0.0
        after = window.total  # what the move saves when it starts at the candidate
        for i, v in items:
            if i >= forced:
                resent, enough = 0, 1
            else:
                resent = max(0, span(i, forced - 1) - (after - past_forced))
                enough = max(1, c.clear_at_least_tokens)
            value = after * c.cache_read_price * c.horizon * so_far - resent * rewrite - addition
            if after >= enough and value >= 0 and (best is None or value > best_value):
                best, best_value = i, value
            after -= v
        return best
