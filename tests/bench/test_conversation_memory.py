"""bench/conversation_memory.py, the parts that need no gateway: the conversations it sends (each its own,
growing by a tool round a request, compact JSON), the checkpoints, the figures per conversation, how it
reads each kind of cache (entries, bounds, weights; the bytes reachable from what it holds; the name of
the module global that makes it), where traced memory grew, and the tables. Nothing is timed."""
from __future__ import annotations

import importlib
import json
import math
import sys
import tracemalloc
import urllib.parse

import orjson
import pytest

import policies.tokens
from bench.conversation_memory import (REPO, at_bound_bytes, cache_contents, cache_figures, cache_tables,
                                       conversation, finite, growth, is_cache, module_caches, outside_caches,
                                       parse_checkpoints, per_conversation, reachable_bytes, request_body,
                                       site_of, summary_table)
from gateway.wire.body_layouts import BodyLayouts
from gateway.wire.seen_messages import SeenMessages
from policies.bounded_cache import BoundedCache
from policies.canonical import NodeIds
from policies.memo import memo

MIB = 1024 * 1024


def test_each_conversation_is_its_own_and_the_same_every_run() -> None:
    first, second = conversation(0, 20, 3), conversation(1, 20, 3)
    assert len(first) == 20 + 2 * 2
    assert first[0] == second[0]  # the system prompt: the one message they share
    assert first[1]["content"].startswith("[conversation 0] ") and second[1]["content"].startswith("[conversation 1] ")
    assert [m["content"] for m in first if m["role"] == "tool"] != [m["content"] for m in second if m["role"] == "tool"]
    assert conversation(0, 20, 3) == first


def test_each_request_is_the_one_before_and_a_tool_round_more_in_compact_json() -> None:
    session = conversation(5, 10, 3)
    bodies = [request_body(session, 10, request) for request in range(3)]
    parsed = [json.loads(body) for body in bodies]
    assert [len(body["messages"]) for body in parsed] == [10, 12, 14]
    assert all(body["messages"] == session[:len(body["messages"])] for body in parsed)
    assert [body["messages"][-1]["role"] for body in parsed] == ["tool"] * 3  # an answered round, as agents send
    assert all(body == orjson.dumps(json.loads(body)) for body in bodies)  # as orjson writes it: no spaces


def test_checkpoints_are_distinct_ascending_counts() -> None:
    assert parse_checkpoints([50, 1, 10, 10]) == [1, 10, 50]
    with pytest.raises(ValueError):
        parse_checkpoints([0, 5])
    with pytest.raises(ValueError):
        parse_checkpoints([])


def test_growth_per_conversation_is_over_the_conversations_added() -> None:
    rows = [{"conversations": 0, "traced_bytes": 0}, {"conversations": 10, "traced_bytes": 5000},
            {"conversations": 50, "traced_bytes": 9000}, {"conversations": 60}]
    found = per_conversation(rows, "traced_bytes")
    assert math.isnan(found[0]) and found[1:3] == [500.0, 100.0] and math.isnan(found[3])


def test_what_the_caches_do_not_hold_is_traced_less_their_growth_since_tracing_began() -> None:
    rows = [{"traced_bytes": 0, "in_caches_bytes": 300}, {"traced_bytes": 1000, "in_caches_bytes": 1100},
            {"traced_bytes": 500}]
    found = outside_caches(rows)
    assert found[:2] == [0, 200] and math.isnan(found[2])


def test_a_memo_is_read_by_its_cache_info() -> None:
    @memo(maxsize=4)
    def doubled(value: int) -> list[int]:
        return [value] * 2

    for value in range(6):
        doubled(value)
    assert cache_figures(doubled) == {"entries": 4, "bound": 4, "weight": None, "max_weight": None, "fill": 1.0,
                                      "by_weight": False}


def test_a_bounded_cache_is_as_full_as_the_fuller_of_entries_and_weight() -> None:
    by_count = BoundedCache(10)
    by_count.put("a", 1)
    assert cache_figures(by_count) == {"entries": 1, "bound": 10, "weight": None, "max_weight": None,
                                       "fill": 0.1, "by_weight": False}
    by_text = BoundedCache(10, max_weight=100, weigh=len)
    by_text.put("a", "x" * 60)
    figures = cache_figures(by_text)
    assert (figures["entries"], figures["weight"], figures["max_weight"]) == (1, 60, 100)
    assert figures["fill"] == 0.6 and figures["by_weight"]


def test_the_caches_that_trim_themselves_are_read_too() -> None:
    ids = NodeIds(limit=8)
    for number in range(3):
        ids("acme", None, {"role": "user", "content": f"message {number}"})
    assert (cache_figures(ids)["entries"], cache_figures(ids)["bound"]) == (3, 8)
    seen = SeenMessages(limit=4)
    seen.passed([b"a", b"b"], [0, 1])
    assert (cache_figures(seen)["entries"], cache_figures(seen)["bound"]) == (2, 4)
    layouts = BodyLayouts(limit_bytes=MIB)
    raw = orjson.dumps({"model": "fake", "messages": [{"role": "system", "content": "s"},
                                                       {"role": "user", "content": "u"}]})
    layouts.lay_out(raw, orjson.loads(raw))
    figures = cache_figures(layouts)
    assert figures["entries"] == 1 and figures["bound"] is None
    assert (figures["weight"], figures["max_weight"]) == (len(raw), MIB) and figures["by_weight"]
    assert all(is_cache(cache) for cache in (ids, seen, layouts))
    assert not is_cache({"size": 1}) and not is_cache(len)
    assert is_cache(policies.tokens.encoding)  # a memo of the gateway's
    assert not is_cache(urllib.parse.urlsplit)  # the standard library's lru_cache


def test_reachable_bytes_count_each_object_once_and_stay_out_of_code() -> None:
    text = "x" * 10_000
    alone, capped = reachable_bytes([[text]])
    assert not capped and alone == sys.getsizeof([text]) + sys.getsizeof(text)
    twice, _ = reachable_bytes([[text, text], (text,)])
    assert twice == sys.getsizeof([text, text]) + sys.getsizeof((text,)) + sys.getsizeof(text)
    function_held, _ = reachable_bytes([[test_reachable_bytes_count_each_object_once_and_stay_out_of_code]])
    assert function_held == sys.getsizeof([None])
    partial, capped = reachable_bytes([[[1], [2], [3]]], limit=2)
    assert capped and partial < reachable_bytes([[[1], [2], [3]]])[0]


def test_what_a_cache_holds_is_its_entries_not_its_machinery() -> None:
    @memo(maxsize=8)
    def text_of(value: int) -> str:
        return "y" * 50_000 + str(value)

    empty, _ = reachable_bytes(cache_contents(text_of))
    text_of(1)
    assert reachable_bytes(cache_contents(text_of))[0] - empty >= 50_000
    cache = BoundedCache(4, max_weight=10**6, weigh=len)
    before, _ = reachable_bytes(cache_contents(cache))
    cache.put("k", "z" * 20_000)
    assert 20_000 <= reachable_bytes(cache_contents(cache))[0] - before < 21_000


def test_a_module_cache_is_named_where_it_is_made() -> None:
    for module in ("gateway.wire.openai_chat", "policies.decision_reuse", "policies.tokens"):
        importlib.import_module(module)  # openai_chat's globals hold the seen messages and the body layouts
    names = {name for name, _ in module_caches().values()}
    assert {"policies.decision_reuse.DECISIONS", "policies.tokens._cached_count", "gateway.wire.openai_chat._SEEN",
            "gateway.wire.openai_chat._LAYOUTS"} <= names


def test_a_site_is_the_innermost_frame_of_the_gateways_code() -> None:
    def frames(*where: tuple[str, int]) -> list[tracemalloc.Frame]:
        return [tracemalloc.Frame(place) for place in where]  # oldest first, as tracemalloc keeps them

    repo = str(REPO)
    assert site_of(frames((f"{repo}/gateway/app.py", 3), (f"{repo}/policies/tokens.py", 64),
                          ("/usr/lib/python3.11/json/decoder.py", 353)), repo) == "policies/tokens.py:64"
    assert site_of(frames((f"{repo}/bench/conversation_memory.py", 9), ("/venv/litellm/x.py", 5)), repo) == \
        "/venv/litellm/x.py:5"


def test_growth_lists_the_sites_that_grew_most() -> None:
    before = {"a.py:1": 100, "b.py:2": 500, "c.py:3": 50}
    after = {"a.py:1": 900, "b.py:2": 400, "c.py:3": 60, "d.py:4": 300}
    assert growth(before, after, 2) == [("a.py:1", 800), ("d.py:4", 300)]
    assert growth(before, after, 10) == [("a.py:1", 800), ("d.py:4", 300), ("c.py:3", 10)]


def test_the_bytes_at_bound_are_the_bytes_over_the_fill() -> None:
    assert at_bound_bytes({"fill": 0.25, "bytes": 1000}) == 4000
    assert at_bound_bytes({"fill": 1.0, "bytes": 1000}) == 1000
    assert math.isnan(at_bound_bytes({"fill": 0.01, "bytes": 1000}))  # too little to go by
    assert math.isnan(at_bound_bytes({"fill": 0.5}))  # not measured


def test_the_tables_show_each_checkpoint() -> None:
    def cache(name: str, entries: int, fill: float, size: int) -> dict:
        return {"name": name, "entries": entries, "bound": 100, "weight": None, "max_weight": None, "fill": fill,
                "by_weight": False, "bytes": size}

    rows = [{"conversations": count, "requests": 3 * count, "seconds": 1.0, "traced_bytes": count * MIB,
             "in_caches_bytes": count * MIB, "rss_mb": 300.0 + count, "rss_trimmed_mb": 290.0 + count,
             "tracemalloc_mb": 1.0, "caches": [cache("small", count, count / 100, count * 10),
                                                cache("big", 2 * count, count / 50, count * MIB)]}
            for count in (0, 10, 40)]
    summary = summary_table(rows).splitlines()
    assert len(summary) == 4 and summary[-1].split()[:4] == ["40", "120", "1.0", "40.0"]
    tables = cache_tables(rows, 1)
    assert "big" in tables and "small" not in tables
    assert "K=40" in tables and "50.0" in tables  # 40 MB at 80%: 50 MB at its bound


def test_the_json_has_no_nan() -> None:
    assert finite({"a": math.nan, "b": [1.5, (math.nan, "x")], "c": {"d": math.nan}}) == \
        {"a": None, "b": [1.5, [None, "x"]], "c": {"d": None}}
