"""The caches that carry one request's work over to the conversation's next (records of the path's
prefix, memories, savings and named terms by node id: policies/path_records.py, policies/assembler.py)
change no projection: every request of every trace, the same messages resent, branches off earlier
prefixes, a policy change between requests, another tenant, other owners and other observation times
project exactly as a process that has seen nothing does."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.format_replay import TRACES, load, turns
from policies import assembler, path_records
from policies.assembler import assemble
from policies.path_records import path_tokens, records_for_path
from policies.policy import policy_from_mapping
from policies.presets import preset
from policies.result_facts import BoundedCache
from policies.transcript import artifact_id_for, message_path

NOW = 1_800_000_000.0
SHARED = ("_RENDERED", "_NODE_MEMORIES", "_NODE_SAVINGS", "_NAMED_TERMS", "_REPLAYS")

# results another participant produced are shown only as memories; old ones are stale
_STRICT = policy_from_mapping({
    "name": "strict", "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 0, "clear_at_least_tokens": 0},
    "tools": [{"match": ["*"], "visibility": "memory", "stale_after": "1h"}],
}, "test")


def fresh(pol: Any, tenant: str, sent: list[dict], monkeypatch: pytest.MonkeyPatch, **kw: Any) -> tuple:
    """Records and projection as a process that has seen nothing builds them (every cache empty)."""
    with monkeypatch.context() as m:
        m.setattr(path_records, "_PREFIXES", BoundedCache(16))
        for name in SHARED:
            m.setattr(assembler, name, BoundedCache(16))
        nodes = message_path(tenant, sent)
        participant = kw.pop("participant", None)
        records = records_for_path(nodes, kw.pop("now", NOW), **kw)
        return records, assemble(pol, sent, records, NOW, foresee=True, participant=participant)


def cached(pol: Any, tenant: str, sent: list[dict], now: float = NOW, **kw: Any) -> tuple:
    """As the gateway builds them: with the caches, token counts per node and node ids."""
    nodes = message_path(tenant, sent)
    participant = kw.pop("participant", None)
    records = records_for_path(nodes, now, **kw)
    return records, assemble(pol, sent, records, NOW, foresee=True, participant=participant,
                             tokens=path_tokens(nodes), node_ids=[n.id for n in nodes])


def same(pol: Any, tenant: str, sent: list[dict], monkeypatch: pytest.MonkeyPatch, **kw: Any) -> None:
    got = cached(pol, tenant, sent, **dict(kw))
    want = fresh(pol, tenant, sent, monkeypatch, **dict(kw))
    assert got[0] == want[0], len(sent)
    assert got[1] == want[1], len(sent)


@pytest.mark.parametrize("path", sorted(TRACES.glob("*.jsonl"))[::2], ids=lambda p: p.stem[:40])
def test_cached_requests_project_as_fresh_ones(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    messages = load(path)["messages"]
    tenant = f"caches-{path.stem}"
    ends = turns(messages)
    for number, end in enumerate(ends):
        sent = messages[:end]
        # the conversation's policy changes now and then between requests
        pol = preset("coding-agent") if number % 5 != 4 else preset("default")
        same(pol, tenant, sent, monkeypatch)
        same(pol, tenant, sent, monkeypatch)  # the same messages resent
    for end in ends[len(ends) // 2::3]:  # a branch: an earlier prefix, then a different last turn
        same(preset("coding-agent"), tenant, [*messages[:end], {"role": "user", "content": f"instead {end}"}],
             monkeypatch)
    # another tenant with the same messages shares nothing it should not
    same(preset("coding-agent"), f"{tenant}-other", messages[:ends[-1]], monkeypatch)


def test_owners_and_observation_times_are_read_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
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
            same(pol, tenant, sent, monkeypatch, owners=owners, observed_at=observed, participant="alice")
            same(pol, tenant, sent, monkeypatch, now=NOW + 10 * number)
