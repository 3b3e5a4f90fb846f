"""policies/bounded_cache.py: entries and, when weighed, the text they keep alive, both bounded."""
from __future__ import annotations

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


def test_views_are_weighed_by_their_text() -> None:
    def view(text: str) -> ArtifactView:
        return ArtifactView(artifact_id="a", tool_name=None, arguments=None, status="ok", content=text, sha256="s",
                            tokens=1, observed_at=0.0)

    assert views_text({1: view("abc"), 4: view("de")}) == 5 and views_text({}) == 0
