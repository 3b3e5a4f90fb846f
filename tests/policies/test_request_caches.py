"""The caches that carry one request's work over to the conversation's next (records of the path's
prefix, memories, savings and named terms by node id: policies/path_records.py, policies/assembly_state.py)
change no projection: every request of every trace, the same messages resent, branches off earlier
prefixes, a policy change between requests, another tenant, other owners and other observation times
project exactly as a process that has seen nothing does."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from bench.format_replay import TRACES, load, turns
from policies import assembler, assembly_state, decision_reuse, epoch_replay, path_records, rounds
from policies.assembler import assemble
from policies.path_records import path_tokens, records_for_path
from policies.policy import policy_from_mapping
from policies.presets import preset
from policies.transcript import artifact_id_for, message_path

NOW = 1_800_000_000.0
# the caches that carry work between requests (the function memos and digest-keyed counts are pure)
SHARED = ((path_records, ("_PREFIXES", "_PATH_TOKENS")),
          (assembly_state, ("_RENDERED", "_NODE_MEMORIES", "_NODE_SAVINGS", "_NAMED_TERMS", "_DUPLICATES")),
          (epoch_replay, ("_REPLAYS", "_TALLIES")), (rounds, ("_ROUNDS",)), (decision_reuse, ("DECISIONS",)),
          (assembler, ("_WHOLE",)))

# results another participant produced are shown only as memories; old ones are stale
_STRICT = policy_from_mapping({
    "name": "strict", "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 0, "clear_at_least_tokens": 0},
    "tools": [{"match": ["*"], "visibility": "memory", "stale_after": "1h"}],
}, "test")


def fresh(pol: Any, tenant: str, sent: list[dict], **kw: Any) -> tuple:
    """Records and projection as a process that has seen nothing builds them (every cache that carries
    work between requests empty), the caches' warm entries set aside meanwhile and back after."""
    with contextlib.ExitStack() as aside:
        for module, names in SHARED:
            for name in names:
                aside.enter_context(getattr(module, name).set_aside())
        nodes = message_path(tenant, sent)
        participant, at = kw.pop("participant", None), kw.pop("at", NOW)
        records = records_for_path(nodes, kw.pop("now", NOW), **kw)
        return records, assemble(pol, sent, records, at, foresee=True, participant=participant)


def cached(pol: Any, tenant: str, sent: list[dict], now: float = NOW, **kw: Any) -> tuple:
    """As the gateway builds them: with the caches, token counts per node and node ids."""
    nodes = message_path(tenant, sent)
    participant, at = kw.pop("participant", None), kw.pop("at", NOW)
    records = records_for_path(nodes, now, **kw)
    return records, assemble(pol, sent, records, at, foresee=True, participant=participant,
                             tokens=path_tokens(nodes), node_ids=[n.id for n in nodes])


def same(pol: Any, tenant: str, sent: list[dict], **kw: Any) -> None:
    got = cached(pol, tenant, sent, **dict(kw))
    want = fresh(pol, tenant, sent, **dict(kw))
    assert got[0] == want[0], len(sent)
    assert got[1] == want[1], len(sent)


@pytest.mark.parametrize("path", sorted(TRACES.glob("*.jsonl"))[::2], ids=lambda p: p.stem[:40])
def test_cached_requests_project_as_fresh_ones(path: Path) -> None:
    messages = load(path)["messages"]
    tenant = f"caches-{path.stem}"
    ends = turns(messages)
    for number, end in enumerate(ends):
        sent = messages[:end]
        # the conversation's policy changes now and then between requests
        pol = preset("coding-agent") if number % 5 != 4 else preset("default")
        same(pol, tenant, sent)
        same(pol, tenant, sent)  # the same messages resent
    for end in ends[len(ends) // 2::3]:  # a branch: an earlier prefix, then a different last turn
        same(preset("coding-agent"), tenant, [*messages[:end], {"role": "user", "content": f"instead {end}"}])
    # another tenant with the same messages shares nothing it should not
    same(preset("coding-agent"), f"{tenant}-other", messages[:ends[-1]])


def test_verbatim_decisions_count_each_requests_own_tokens() -> None:
    """A message's `verbatim` decision is taken from the conversation's earlier projection only where its
    tokens are this request's: the same node (canonical JSON) may count differently written otherwise."""
    messages = load(sorted(TRACES.glob("*.jsonl"))[0])["messages"]
    end = turns(messages)[3]
    nodes = message_path("caches-tokens", messages[:end])
    tokens = path_tokens(nodes)
    records = records_for_path(nodes, NOW)
    pol = preset("coding-agent")
    first = assemble(pol, messages[:end], records, NOW, tokens=tokens, node_ids=[n.id for n in nodes])
    other = [count + 1 if index == 0 else count for index, count in enumerate(tokens)]
    again = assemble(pol, messages[:end], records, NOW, tokens=other, node_ids=[n.id for n in nodes])
    assert (first.decisions[0].action, first.decisions[0].tokens_before) == ("verbatim", tokens[0])
    assert (again.decisions[0].action, again.decisions[0].tokens_before) == ("verbatim", tokens[0] + 1)


def test_owners_and_observation_times_are_read_per_request() -> None:
    """A prefix's records are reused with each request's owners and observation times, and a policy that
    shows other participants' results as memories gets no saving computed for another owner."""
    messages = load(sorted(TRACES.glob("*.jsonl"))[0])["messages"]
    ends = turns(messages)
    tenant = "caches-owners"
    for number, end in enumerate(ends[:12]):
        sent = messages[:end]
        nodes = message_path(tenant, sent)
        tools = [artifact_id_for(n.id) for n in nodes if n.message.get("role") == "tool"]
        owners = {a: ("alice" if (i + number) % 3 else "bob") for i, a in enumerate(tools)}
        observed = {a: NOW - (7200 if (i + number) % 2 else 60) for i, a in enumerate(tools)}
        for pol in (_STRICT, preset("coding-agent")):
            same(pol, tenant, sent, owners=owners, observed_at=observed, participant="alice")
            same(pol, tenant, sent, now=NOW + 10 * number)


def test_decisions_are_reused_only_where_nothing_they_read_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The previous request's decisions are taken for the messages whose inputs are unchanged: across
    epoch moves (the reason names the new epoch), results newly superseded or retried, the latest rounds
    and trailing results moving on, and, under a policy that marks results stale, a later `now`."""
    reused = []
    unchanged = decision_reuse.unchanged

    def counting(*args: Any) -> Any:
        found = unchanged(*args)
        reused.append(found is not None)
        return found

    monkeypatch.setattr(decision_reuse, "unchanged", counting)
    epochs = set()
    for path in sorted(TRACES.glob("*.jsonl"))[1::2]:
        messages = load(path)["messages"]
        tenant = f"reuse-{path.stem}"
        for number, end in enumerate(turns(messages)):
            sent = messages[:end]
            _, projection = cached(preset("coding-agent"), tenant, sent)
            epochs.add(projection.epoch_round)
            same(preset("coding-agent"), tenant, sent)
            # results go stale as `now` moves on; the same `now` resent
            same(_STRICT, f"{tenant}-stale", sent, at=NOW + 1200 * number)
            same(_STRICT, f"{tenant}-stale", sent, at=NOW + 1200 * number)
    assert sum(reused) > len(reused) // 3 and len(epochs) > 3  # the reuse was exercised, across epochs


def _agent_run(rounds: int) -> list[dict]:
    """Reads of a few files again and again (each supersedes the previous read of its file), failed
    commands retried several rounds later, outputs repeated word for word; long enough outputs for the
    boundary to move now and then."""
    body = "\n".join(f"line {i}: some output of the tool with words in it" for i in range(40))
    messages: list[dict] = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
    for r in range(rounds):
        if r % 3 == 0:
            name, arguments, result = "read_file", {"path": f"src/f{r % 5}.py"}, f"# f{r % 5} as of {r}\n{body}"
        elif r % 3 == 1:
            step = r - 9 if r % 2 and r >= 9 else r  # a failed step is run again nine rounds later
            name, arguments = "bash", {"command": f"make step{step}"}
            result = (f"Error: step {step} failed\n" if r % 4 == 1 and step == r else f"step {step} ok\n") + body
        else:
            name, arguments, result = "grep", {"pattern": "x"}, "same output every time\n" + body
        call = {"id": f"c{r}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"c{r}", "content": result}]
    return messages


@pytest.mark.parametrize("keep,trigger", [(1, 2000), (3, 2000), (1, 9000)])
def test_reuse_across_supersessions_retries_and_duplicates(keep: int, trigger: int) -> None:
    """Every request of an agent run (the boundary moving by one round, or by many at once), then the
    same requests by a participant for whom earlier repeats of an output are someone else's, shown as
    memories (which earlier output a repeat refers to changes from request to request)."""
    messages = _agent_run(60)
    base = preset("coding-agent").model_dump(mode="json")
    compaction = {**base["compaction"], "keep_recent_rounds": keep, "trigger_tokens": trigger}
    pol = policy_from_mapping({**base, "compaction": compaction}, "test")
    tools = [{**rule, "visibility": "memory"} if "grep" in rule["match"] else rule for rule in base["tools"]]
    private = policy_from_mapping({**base, "compaction": compaction, "tools": tools}, "test")
    tenant = f"agent-run-{keep}-{trigger}"
    for end in range(4, len(messages) + 1, 2):
        same(pol, tenant, messages[:end])
    early = artifact_id_for(message_path(tenant, messages[:4])[3].id)  # the user names a compacted result
    same(pol, tenant, [*messages, {"role": "assistant", "content": "done"},
                       {"role": "user", "content": f"show me artifact:{early} again"}])
    for end in range(4, len(messages) + 1, 2):  # a conversation of its own: the records keep their views
        nodes = message_path(f"{tenant}-private", messages[:end])
        results = [artifact_id_for(n.id) for n in nodes if n.message.get("role") == "tool"]
        owners = {a: "bob" if (i // 3 + end // 2) % 4 == 0 else "alice" for i, a in enumerate(results)}
        same(private, f"{tenant}-private", messages[:end], owners=owners, participant="alice")


def test_memories_that_follow_a_question_are_the_same_cached_as_fresh() -> None:
    # A memory rendered as of the latest round reads the user turns up to the request's end: a question at
    # the same round count, the prose before it, and the rounds after it, each as a fresh process builds it.
    from tests.policies.test_follow_question import ORDER, ask, desk

    messages = desk()[:8]  # the log's round, then one more: this request's move compacts the log as of now
    steps = [messages, messages + [{"role": "assistant", "content": "Lyon has room."}]]
    steps.append(steps[-1] + [ask(f"Which carrier has order {ORDER}?")])
    for k in range(3):
        steps.append(steps[-1] + [
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"t{k}", "type": "function", "function": {
                "name": "track_order", "arguments": json.dumps({"order": ORDER})}}]},
            {"role": "tool", "tool_call_id": f"t{k}", "content": json.dumps({"scan": k, "pad": "x" * 900})}])
    steps.append(steps[-1] + [{"role": "assistant", "content": "Noted."}, ask("And ORD-00000?")])
    for sent in steps:
        same(preset("coding-agent"), "caches-desk", sent)
