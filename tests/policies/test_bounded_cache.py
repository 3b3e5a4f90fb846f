"""policies/bounded_cache.py: entries and, when weighed, the text they keep alive, both bounded."""
from __future__ import annotations

import contextlib
from typing import Any

from policies.bounded_cache import BoundedCache, views_text
from policies.memories import ArtifactView


def test_the_least_recently_used_entry_goes_first() -> None:
    cache = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == (1, None, 3, 2)


def test_a_weighed_cache_keeps_at_most_its_weight() -> None:
    cache = BoundedCache(100, max_weight=10, weigh=len)
    cache.put("a", "xxxx")
    cache.put("b", "yyyy")
    cache.put("a", "xxx")  # replaced: its old weight is given back
    assert cache.weight == 7
    cache.put("c", "zzzzz")  # 12 > 10: the least recently used ("b") goes
    assert (cache.get("b"), cache.get("a"), cache.get("c"), cache.weight) == (None, "xxx", "zzzzz", 8)
    cache.put("d", "w" * 11)  # heavier than the whole budget: not kept, nothing else evicted for it
    assert (cache.get("d"), len(cache), cache.weight) == (None, 2, 8)


def test_an_entry_heavier_than_largest_is_not_kept_though_the_budget_has_room() -> None:
    cache = BoundedCache(100, max_weight=100, weigh=len, largest=10)
    cache.put("a", "x" * 10)
    cache.put("b", "y" * 11)  # within the budget, past the largest entry: not kept, nothing evicted
    assert (cache.get("a"), cache.get("b"), cache.weight) == ("x" * 10, None, 10)
    cache.put("a", "z" * 40)  # a kept key given a value past it: the old one goes too
    assert (cache.get("a"), len(cache), cache.weight) == (None, 0, 0)
    assert BoundedCache(4, largest=10).largest is None  # unweighed: nothing to compare
    assert BoundedCache(4, max_weight=5, weigh=len, largest=10).largest == 5  # never past the whole budget


def test_the_caches_of_views_keep_no_conversation_past_its_share_of_their_budget() -> None:
    """A conversation whose results come to more than VIEWS_TEXT_LARGEST characters is not kept by the
    caches that carry views to its next request (that request builds them again), a smaller one is."""
    from policies import assembly_state, decision_reuse, path_records
    from policies.assembler import assemble
    from policies.bounded_cache import VIEWS_TEXT_LARGEST
    from policies.canonical import message_path
    from policies.path_records import path_tokens, records_for_path
    from policies.presets import preset

    caches = (path_records._PREFIXES, decision_reuse.DECISIONS, assembly_state._DUPLICATES)
    assert {cache.largest for cache in caches} == {VIEWS_TEXT_LARGEST}

    def project(size: int, tenant: str) -> list[int]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for n in range(4):
            messages += [{"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{n}", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": f"c{n}", "content": f"{n} " + "r" * (size // 4)}]
        messages.append({"role": "user", "content": "and now?"})
        with contextlib.ExitStack() as aside:
            for cache in caches:
                aside.enter_context(cache.set_aside())
            nodes = message_path(tenant, messages)
            records = records_for_path(nodes, 1_000.0)
            assemble(preset("coding-agent"), messages, records, 1_000.0, tokens=path_tokens(nodes),
                     node_ids=[node.id for node in nodes])
            return [len(cache) for cache in caches]

    assert project(VIEWS_TEXT_LARGEST // 2, "small") == [1, 1, 1]
    assert project(VIEWS_TEXT_LARGEST + 1000, "large") == [0, 0, 0]


def test_views_are_weighed_by_their_text() -> None:
    def view(text: str) -> ArtifactView:
        return ArtifactView(artifact_id="a", tool_name=None, arguments=None, status="ok", content=text, sha256="s",
                            tokens=1, observed_at=0.0)

    assert views_text({1: view("abc"), 4: view("de")}) == 5 and views_text({}) == 0


def test_records_count_the_text_of_their_views_as_views_text_does() -> None:
    """What the caches of views weigh (`Records.text_chars`): the count `records_for_path` keeps as it
    extends an earlier request's records, or `views_text` where none was kept."""
    from policies.assembly_types import Records
    from policies.canonical import message_path
    from policies.path_records import records_for_path

    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n in range(12):
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{n}", "type": "function",
             "function": {"name": "read", "arguments": "{\"n\": %d}" % n * (n + 1)}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": "ü" * (n * 7)}]
        records = records_for_path(message_path("t", messages), 1_000.0)  # each extends the one before
        assert records.views_chars is not None and records.text_chars() == views_text(records.artifacts) > 0
    assert Records(artifacts=records.artifacts).text_chars() == views_text(records.artifacts)
