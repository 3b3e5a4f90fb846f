"""What the assembler tells the cache markers about the next move, and what a move must pay for.

`Projection.next_move_from` is the first message the next move is expected to
change (the gateway puts an Anthropic cache marker just before it, so the move
reads what precedes it from the cache), and `next_move_due` says the next request
is expected to make that move (the gateway then leaves what follows uncached,
since the move rewrites it); `first_move_tokens` is what the first
compaction adds to the prompt besides its memories (the rehydration tool, added
where the first memory appears on Anthropic), which that move must pay for. And the token
counts the gateway remembers per node change no projection.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.format_replay import TRACES, load, turns
from policies.assembler import assemble
from policies.assembly_state import Assembly
from policies.path_records import path_tokens, records_for_path
from policies.presets import preset
from policies.tokens import DEFAULT_ENCODING, message_tokens
from policies.transcript import message_path
from tests.policies.test_assembler import BIG, conversation, policy, project, tool_round

NOW = 1_800_000_000.0


def _projections(path: Path):
    """The coding-agent projection of every request an agent made in the trace, in order."""
    messages = load(path)["messages"]
    pol = preset("coding-agent")
    for end in turns(messages):
        sent = messages[:end]
        yield assemble(pol, sent, records_for_path(message_path("t", sent), NOW), NOW, foresee=True)


def _opens_a_superseded_round(previous, projection, index: int) -> bool:
    """Whether message `index` is an assistant turn this projection compacts whose round holds a result
    this projection supersedes and `previous` did not."""
    if projection.decisions[index].action not in ("thought_compacted", "arguments_compacted"):
        return False
    for later in range(index + 1, len(previous.messages)):
        if projection.messages[later].get("role") != "tool":
            return False
        if projection.decisions[later].action == "superseded" and previous.decisions[later].action != "superseded":
            return True
    return False


@pytest.mark.parametrize("path", sorted(TRACES.glob("*.jsonl")), ids=lambda p: p.stem[:40])
def test_the_foreseen_message_is_the_first_a_move_changes(path: Path) -> None:
    """Whenever a request changes what an earlier one forwarded (a move), the first message it changes is
    the one the earlier request foresaw; only a supersession (a later read of the same file, which no
    one can foresee) may change an earlier one first, and with it the turn that made the superseded
    call (its prose or arguments compacted: the provider reads afresh from there on anyway)."""
    previous = None
    moves = 0
    for projection in _projections(path):
        if previous is not None:
            changed = next((i for i, sent in enumerate(previous.messages) if projection.messages[i] != sent), None)
            if changed is not None and projection.decisions[changed].action != "superseded" \
                    and not _opens_a_superseded_round(previous, projection, changed):
                moves += 1
                assert changed == previous.next_move_from, (changed, previous.next_move_from)
        previous = projection
    if "ponyc" in path.stem or "taubench" in path.stem:
        assert moves > 0  # the long traces do move


@pytest.mark.parametrize("path", sorted(TRACES.glob("*.jsonl")), ids=lambda p: p.stem[:40])
def test_a_due_move_is_made_by_the_next_request_that_brings_a_round(path: Path) -> None:
    """When a request says the next one is due to move, the next request, if the model answered with a
    call, changes the foreseen message or one before it (a supersession): what the gateway left uncached
    is never read. A prose answer makes no round and no move; that risk is what `next_move_due` weighs."""
    messages = load(path)["messages"]
    ends = turns(messages)
    previous, previous_end, due = None, 0, 0
    for end, projection in zip(ends, _projections(path)):
        if previous is not None and previous.next_move_due:
            assert previous.next_move_from is not None
            if any(m.get("role") == "assistant" and m.get("tool_calls") for m in messages[previous_end:end]):
                due += 1
                changed = next((i for i, sent in enumerate(previous.messages) if projection.messages[i] != sent), None)
                assert changed is not None and changed <= previous.next_move_from, (changed, previous.next_move_from)
        previous, previous_end = projection, end
    if "ponyc" in path.stem or "taubench" in path.stem:
        assert due > 0


def test_a_move_is_due_when_the_model_keeps_answering_results_with_calls() -> None:
    """Due needs a move that pays at the next round and a model that answers tool results with calls
    often enough: one that has answered them in prose half the time is not expected to bring that round."""
    calls = conversation(4)
    projection, _ = project(calls, policy(), foresee=True)
    assert projection.next_move_from == len(calls) - 1 and projection.next_move_due
    prose = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Do the task."}]
    for i in range(4):
        prose += [*tool_round(f"c{i}", "bash", f"run {i}\n{BIG}", command=f"make step{i}"),
                  {"role": "assistant", "content": f"step {i} is done"}, {"role": "user", "content": "go on"}]
    prose += tool_round("c4", "bash", f"run 4\n{BIG}", command="make step4")
    projection, _ = project(prose, policy(), foresee=True)
    assert projection.next_move_from == len(prose) - 1 and not projection.next_move_due
    early, _ = project(conversation(2), policy(), foresee=True)  # one answer to results: too early to tell
    assert early.next_move_from == len(conversation(2)) - 1 and not early.next_move_due


def test_nothing_is_foreseen_when_nothing_would_save() -> None:
    messages = [{"role": "user", "content": "hi"}, *tool_round("c0", "bash", "ok"), *tool_round("c1", "bash", "ok")]
    projection, _ = project(messages, policy(compaction={"min_tokens": 200}), foresee=True)
    assert projection.next_move_from is None and not projection.next_move_due


def test_the_foreseen_message_is_the_next_result_to_leave_the_window() -> None:
    messages = conversation(3)
    assert project(messages, policy())[0].next_move_from is None  # not asked for
    projection, _ = project(messages, policy(), foresee=True)
    # the first two rounds' results are memories already; the latest round's is next, once another follows
    assert [projection.decisions[i].action for i in (3, 5)] == ["compacted", "compacted"]
    assert projection.next_move_from == len(messages) - 1
    assert projection.decisions[len(messages) - 1].action == "verbatim"


def test_the_first_move_pays_for_what_it_adds() -> None:
    """A compaction that saves less than the tool it would bring along is not made; one that saves more is."""
    small = "\n".join(f"output line {i} of the build with some words" for i in range(60))
    messages = [{"role": "user", "content": "go"}, *tool_round("c0", "bash", small), *tool_round("c1", "bash", "ok")]
    pol = policy()  # a long horizon: a move pays when it saves more than it adds
    plain, _ = project(messages, pol)
    assert plain.decisions[2].action == "compacted"
    saved = plain.decisions[2].tokens_before - plain.decisions[2].tokens_after
    declined, _ = project(messages, pol, first_move_tokens=saved + 1)
    assert declined.decisions[2].action == "verbatim" and declined.first_reference is None
    big = [{"role": "user", "content": "go"}, *tool_round("c0", "bash", BIG), *tool_round("c1", "bash", "ok")]
    made, _ = project(big, pol, first_move_tokens=saved + 1)
    assert made.decisions[2].action == "compacted" and made.first_reference == 2


@pytest.mark.parametrize("path", sorted(TRACES.glob("*.jsonl"))[::3], ids=lambda p: p.stem[:40])
def test_counts_remembered_per_node_change_nothing(path: Path) -> None:
    """Token counts taken from the per-node memo (policies/path_records.py) give the same projection as
    counting afresh, and the forwarded total is what the forwarded messages count."""
    messages = load(path)["messages"]
    pol = preset("coding-agent")
    for end in turns(messages)[::4]:
        sent = messages[:end]
        nodes = message_path("t", sent)
        records = records_for_path(nodes, NOW)
        fresh = assemble(pol, sent, records, NOW)
        remembered = assemble(pol, sent, records, NOW, tokens=path_tokens(nodes))
        assert remembered == fresh
        assert fresh.tokens_forwarded == sum(message_tokens(m) for m in fresh.messages)


@pytest.mark.parametrize("path", sorted(TRACES.glob("*.jsonl")), ids=lambda p: p.stem[:40])
def test_a_resumed_replay_gives_what_a_full_replay_gives(path: Path) -> None:
    """With node ids the epoch replay resumes where the conversation's previous request left it
    (policies/epoch_replay.py `_REPLAYS`); every request, and a branch that re-sends an earlier prefix with
    another ending, projects exactly as replaying every round afresh does."""
    messages = load(path)["messages"]
    pol = preset("coding-agent")
    tenant = f"resume-{path.stem}"

    def both(sent: list[dict]) -> None:
        nodes = message_path(tenant, sent)
        records = records_for_path(nodes, NOW)
        fresh = assemble(pol, sent, records, NOW, foresee=True)
        resumed = assemble(pol, sent, records, NOW, foresee=True, node_ids=[n.id for n in nodes])
        assert resumed == fresh, len(sent)

    ends = turns(messages)
    for end in ends:
        both(messages[:end])
    last = messages[:ends[-1]]
    nodes = message_path(tenant, last)
    state = Assembly(pol, last, records_for_path(nodes, NOW), NOW, "openai", DEFAULT_ENCODING, None,
                      node_ids=[n.id for n in nodes])
    if state.rounds:
        assert state._resumed_replay().t == len(state.rounds)  # the replay resumes, it is not redone
    for end in ends[len(ends) // 2::3]:  # a branch: an earlier prefix, then a different last turn
        both([*messages[:end], {"role": "user", "content": f"instead, stop at {end}"}])
