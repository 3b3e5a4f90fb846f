"""Loaded by a gateway that bench/memory_growth.py starts (this folder on its PYTHONPATH): on SIGUSR1,
it clears the process's registered caches (policies/memo.py `reset_memos`: every memoised function and
`BoundedCache`), the upstream client's message memo and the request path's bounded tables (node ids,
messages seen, body layouts, recent assemblies: what each held goes in the report), collects, trims the C heap, and writes what is
still alive to the JSON file named by GATEWAY_MEMORY_HOOK: RSS, pymalloc's allocated blocks, the
objects the collector tracks by type, and, when tracemalloc runs (PYTHONTRACEMALLOC), the allocation
sites that grew since the previous signal. What survives the clearing is what the process keeps
outside its bounded caches."""
from __future__ import annotations

import os
import signal

if os.environ.get("GATEWAY_MEMORY_HOOK"):
    def _rss_mb() -> float:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024

    def _pymalloc_allocated() -> int:
        import re
        import sys
        import tempfile
        with tempfile.TemporaryFile("w+") as out:
            saved = os.dup(2)
            os.dup2(out.fileno(), 2)
            try:
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            out.seek(0)
            found = re.search(r"bytes in allocated blocks\s+=\s+([\d,]+)", out.read())
        return int(found.group(1).replace(",", "")) if found else -1

    def _census(signum: int, frame: object) -> None:
        import ctypes
        import gc
        import json
        import tracemalloc
        from collections import Counter

        from policies.memo import reset_memos
        report = {"rss_mb_before": _rss_mb()}
        # The start freezes what it built (gateway/app.py): frozen objects are invisible to
        # gc.get_objects. Unfrozen here, and frozen again at the end, so every object is counted.
        gc.unfreeze()
        reset_memos()
        from gateway.upstream.litellm_client.chat_preparation import MessageMemo
        memos = [o for o in gc.get_objects() if isinstance(o, MessageMemo)]
        for memo in memos:
            memo.clear()
        # the request path's bounded tables outside policies/memo.py's registry
        from gateway.wire.body_layouts import BodyLayouts
        from gateway.wire.seen_messages import SeenMessages
        from policies.canonical import NodeIds
        from gateway.pipeline.assembly_bases import RecentAssemblies
        held = {"node_ids": 0, "seen_messages": 0, "body_layouts_mb": 0.0, "recent_assemblies": 0}
        for found in gc.get_objects():
            if isinstance(found, RecentAssemblies):
                held["recent_assemblies"] += len(found._items)
                found._items.clear()
                found.held = 0
            elif isinstance(found, NodeIds):
                held["node_ids"] += len(found._ids)
                found._ids.clear()
            elif isinstance(found, SeenMessages):
                held["seen_messages"] += len(found._passed)
                found._passed.clear()
            elif isinstance(found, BodyLayouts):
                held["body_layouts_mb"] += found._held / 1e6
                held["body_layouts_parsed_mb"] = held.get("body_layouts_parsed_mb", 0.0) + found._parsed_held / 1e6
                found._layouts.clear()
                found._sighted.clear()
                found._held = 0
                found._parsed.clear()
                found._parsed_held = 0
        report["held"] = held
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        objects = gc.get_objects()
        report.update(rss_mb=_rss_mb(), pymalloc_mb=_pymalloc_allocated() / 1e6, message_memos=len(memos),
                      gc_objects=len(objects),
                      types=dict(Counter(type(o).__name__ for o in objects).most_common(25)))
        del objects
        if tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot()
            previous = globals().get("_PREVIOUS")
            if previous is not None:
                report["growth"] = [{"mb": round(s.size_diff / 1e6, 3), "blocks": s.count_diff,
                                     "where": s.traceback.format()[-8:]}
                                    for s in snapshot.compare_to(previous, "traceback")[:10]]
            globals()["_PREVIOUS"] = snapshot
        gc.freeze()
        path = os.environ["GATEWAY_MEMORY_HOOK"]
        with open(path + ".tmp", "w") as out:
            json.dump(report, out)
        os.replace(path + ".tmp", path)

    signal.signal(signal.SIGUSR1, _census)
