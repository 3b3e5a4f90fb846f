"""What one gateway process keeps as the conversations it has served add up, and where it stops growing.

    .venv/bin/python bench/conversation_memory.py                 # ~4 min on 2 busy CPUs
    .venv/bin/python bench/conversation_memory.py --quick         # smoke run, ~25 s
    .venv/bin/python bench/conversation_memory.py --checkpoints 100 500 1000 2000 3000 --requests 2  # ~25 min
    .venv/bin/python bench/conversation_memory.py --checkpoints 500 1000 2000 3000 4000 --requests 2 \
        --no-trace --no-deep                                      # RSS alone, every cache full: ~10 min

The real app (`gateway.app.create_app`, uvicorn in a thread of this process, SQLite in a temporary
folder, tenant `acme` under the `coding-agent` policy) in front of the constant upstream
(bench/constant_upstream.py, a process of its own). Conversations are served one after the other,
--clients of them at a time: conversation c is a synthetic coding-agent session
(bench/bench_transcripts.py `synthetic_session`, seed c, its first user message naming c: its path
shares no node with another's past the system prompt) sent --requests times as an agent sends it
(compact JSON, as the SDKs write it), --messages messages the first time and one tool round (2
messages) more each time after, each request after the answer to the one before. One warm-up
conversation comes first, outside the count; tracemalloc starts after it (--frames frames a trace;
each frame more slows the gateway down: 4 frames serve ~2.5x slower than 1). Each time the count of
conversations served reaches a --checkpoints figure: once the gateway has written the outcomes of
its requests, `gc.collect()`, then

  conversations   distinct conversations served so far (K); `requests`: chat completions sent in all
  seconds         wall time of the conversations since the previous checkpoint (the measuring left out)
  traced MB       tracemalloc's current traced memory: Python allocations made since tracing began and
                  still alive, i.e. what the conversations left behind
  KB/conv         traced growth since the previous checkpoint over the conversations added
  caches MB       the bytes reachable from every cache below at once (sys.getsizeof, each object once)
  outside MB      traced MB less what the caches came to hold since tracing began: memory the
                  conversations left outside every cache (a structure that keeps growing shows here),
                  and what sys.getsizeof does not see of what the caches hold: orjson (3.13) hands
                  back `dumps`'s bytes in the buffer it wrote them in (a 38-byte text holds a 4 KB
                  block, a 5 KB one 64 KB), so a cache of such texts shows here and at its allocation
                  site (policies/canonical.py `orjson_text`) more than in its own MB
  RSS MB          the process's VmRSS (one process: the gateway, this client, tracemalloc's bookkeeping)
  trimmed         VmRSS after `malloc_trim(0)` (what gateway/ops/memory.py's Trimmer does after large
                  bodies): the pages the process holds on to
  RSS KB/conv     trimmed RSS growth since the previous checkpoint over the conversations added
  tm MB           tracemalloc's bookkeeping, inside the RSS figures, not the gateway's
(`-` where not measured: the traced figures with --no-trace, the caches' bytes with --no-deep.)

Per cache: every `policies.memo` memo and `BoundedCache` (`policies.memo.registered()`), named by the
module global or the `app.state.services` attribute that holds it, and the caches that do not register,
found the same way: policies/canonical.py `NodeIds`, gateway/pipeline/assembly_bases.py
`RecentAssemblies`, the direct transport's `MessageMemo` (gateway/upstream/litellm_client/
chat_preparation.py), gateway/wire/seen_messages.py `SeenMessages`, gateway/wire/body_layouts.py
`BodyLayouts`. The --caches that hold most at the last checkpoint are shown:
  bound           entries (`maxsize`, `size`, `limit`) and, where it weighs its entries, weight (`w`:
                  characters, or bytes of bodies)
  entries         at the last checkpoint
  fill table      per checkpoint: entries / entry bound, or weight / weight bound where that is the
                  fuller (`w`); a cache that drops its oldest quarter past its bound (`NodeIds`,
                  `SeenMessages`, `MessageMemo`) stays between 75 and 100% once full
  MB table        per checkpoint, the bytes reachable from its entries (objects several caches hold are
                  counted in each); `at bound`: the last checkpoint's over its fill, what it comes to once
                  full with entries like these
Last, the allocation sites whose traced memory grew most between the last two checkpoints, in KB per
conversation added (the innermost frame in gateway/, policies/ or storage/ where --frames keeps one).
--json PATH writes every figure: each checkpoint's every cache and those sites.

Measured (2 CPUs shared with other work; 100-message conversations of 2 requests, the two long runs
above). At cf1743a traced memory grew 690 KB a conversation over the first 100, 223-241 KB from 500 to
2,000 and 60 KB from 2,000 to 3,000 (626 MB at 3,000: 617 MB in the caches, 9.6 MB outside them, 9.4 MB
at 2,000). At 00cd703, where the direct transport's memo also keeps each message's JSON text (in
orjson's buffers: ~4 KB a message, ~60 MB outside the caches' own MB once the memo is full), the
trimmed RSS without tracemalloc was 365 MB after the warm-up, 1,055 MB at 2,000 conversations, 1,116 MB
at 3,000 and 1,142 MB at 4,000: 27 KB a conversation, the last caches filling.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import itertools
import json
import math
import os
import sys
import tempfile
import time
import tracemalloc
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx  # noqa: E402
import orjson  # noqa: E402

from bench_transcripts import TOOLS, synthetic_session  # noqa: E402

DEFAULT_CHECKPOINTS = (1, 10, 50, 100, 200, 400)
QUICK_CHECKPOINTS = (1, 5, 20)
MIB = 1024 * 1024
PROJECT_FOLDERS = ("gateway", "policies", "storage")
WARM_UP = -1  # the conversation served before tracing starts


# --- the conversations --------------------------------------------------------

def conversation(number: int, messages: int, requests: int) -> list[dict[str, Any]]:
    """Every message conversation `number` ever sends: its first request's `messages`, then a tool
    round more per request. Its own seed (its tool outputs are its own) and its own first user message,
    so past the system prompt its path shares no node with another's (a node id names every message
    before it)."""
    session = synthetic_session(messages + 2 * (requests - 1), seed=number)
    first = session[1]
    session[1] = {**first, "content": f"[conversation {number}] {first['content']}"}
    return session


def request_body(session: Sequence[dict[str, Any]], messages: int, request: int) -> bytes:
    """Request number `request` (from 0) of a conversation: its first `messages` + 2 * request messages,
    compact JSON as the OpenAI and Anthropic SDKs write it (gateway/wire/body_layouts.py holds such
    bodies to recognise the next one's prefix)."""
    return orjson.dumps({"model": "fake", "tools": TOOLS, "messages": list(session[:messages + 2 * request])})


def parse_checkpoints(values: Iterable[int]) -> list[int]:
    """Distinct, ascending, positive counts of conversations."""
    found = sorted(set(values))
    if not found or found[0] < 1:
        raise ValueError(f"checkpoints must be counts of conversations, 1 or more: {found}")
    return found


def per_conversation(rows: Sequence[Mapping[str, Any]], figure: str) -> list[float]:
    """Per row, the growth of `figure` since the row before over the conversations added (bytes per
    conversation; NaN for the first row, or where either figure is missing)."""
    out = [math.nan]
    for before, after in itertools.pairwise(rows):
        added = after["conversations"] - before["conversations"]
        low, high = before.get(figure, math.nan), after.get(figure, math.nan)
        out.append((high - low) / added if added > 0 else math.nan)
    return out


# --- the caches -----------------------------------------------------------------

def cache_figures(cache: Any) -> dict[str, Any]:
    """Entries, bounds and weight of a cache, whichever kind: a `memo` (an lru_cache), a `BoundedCache`,
    or one of the caches that trim themselves (`NodeIds`, `RecentAssemblies`, `MessageMemo`,
    `SeenMessages`). `fill`: the fuller of entries / entry bound and weight / weight bound (`by_weight`)."""
    info = getattr(cache, "cache_info", None)
    if info is not None:
        got = info()
        entries, bound = got.currsize, got.maxsize
    else:
        entries = len(cache) if hasattr(cache, "__len__") else len(_main_table(cache))
        bound = next((getattr(cache, name) for name in ("size", "limit") if hasattr(cache, name)), None)
    weight = next((getattr(cache, name) for name in WEIGHTS if hasattr(cache, name)), None)
    max_weight = next((getattr(cache, name) for name in MAX_WEIGHTS if hasattr(cache, name)), None)
    by_entries = entries / bound if bound else math.nan
    by_weight = weight / max_weight if weight is not None and max_weight else math.nan
    fill = max((value for value in (by_entries, by_weight) if not math.isnan(value)), default=math.nan)
    return {"entries": entries, "bound": bound, "weight": weight if max_weight is not None else None,
            "max_weight": max_weight, "fill": fill,
            "by_weight": not math.isnan(by_weight) and (math.isnan(by_entries) or by_weight > by_entries)}


_TABLES = ("_items", "_ids", "_prepared", "_passed", "_layouts")
WEIGHTS = ("weight", "chars", "held_bytes")  # BoundedCache, MessageMemo, BodyLayouts
MAX_WEIGHTS = ("max_weight", "max_chars", "limit_bytes")


def _main_table(cache: Any) -> Mapping[Any, Any]:
    return next(getattr(cache, name) for name in _TABLES if hasattr(cache, name))


_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           types.CodeType, types.FrameType, property)


_LEAVES = frozenset({str, bytes, int, float, bool, type(None), complex})  # nothing reachable from them


def reachable_bytes(roots: Iterable[Any], limit: int = 10_000_000) -> tuple[int, bool]:
    """The bytes (sys.getsizeof) of the objects reachable from `roots`, each once, not entering types,
    modules, functions and code; and whether the walk stopped at `limit` objects (then a lower bound)."""
    seen: set[int] = set()
    todo = [root for root in roots if not isinstance(root, _OPAQUE)]
    total = 0
    while todo:
        found = todo.pop()
        if id(found) in seen:
            continue
        if len(seen) >= limit:
            return total, True
        seen.add(id(found))
        total += sys.getsizeof(found)
        if type(found) not in _LEAVES:
            todo.extend(child for child in gc.get_referents(found) if not isinstance(child, _OPAQUE))
    return total, False


def cache_contents(cache: Any) -> list[Any]:
    """What a cache holds, without the cache's own machinery (its lock, its `weigh` function)."""
    if hasattr(cache, "cache_info"):  # an lru_cache: it refers to each entry's key and value, its table, its function
        return [child for child in gc.get_referents(cache) if child is not getattr(cache, "__dict__", None)]
    return [value for value in vars(cache).values() if isinstance(value, (dict, list, tuple, set))]


CACHE_TYPE_NAMES = ("BoundedCache", "NodeIds", "RecentAssemblies", "MessageMemo", "SeenMessages", "BodyLayouts")


def _project_module(name: str) -> bool:
    return name.split(".")[0] in PROJECT_FOLDERS


def is_cache(value: Any) -> bool:
    """A cache this bench reports: an instance of one of the gateway's cache classes, or a function of
    the gateway's memoised with `memo` (not the standard library's own, such as `urllib.parse.urlsplit`)."""
    kind = type(value)
    if kind.__name__ in CACHE_TYPE_NAMES and _project_module(kind.__module__):
        return True
    return isinstance(value, functools._lru_cache_wrapper) and _project_module(getattr(value, "__module__", "") or "")


def module_caches() -> dict[int, tuple[str, Any]]:
    """id -> (module.NAME, cache) of the caches held by the gateway's modules' globals (and, for a memo
    made on a class's method, by the class), each named where it is made: a memo by its own module, an
    instance by the module whose source assigns the name (not one that imports it)."""
    candidates: dict[int, list[tuple[str, str, Any]]] = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not _project_module(module_name):
            continue
        for name, value in list(vars(module).items()):
            if is_cache(value):
                candidates.setdefault(id(value), []).append((module_name, name, value))
            elif isinstance(value, type) and value.__module__ == module_name:
                for attribute, member in vars(value).items():
                    if is_cache(member):
                        candidates.setdefault(id(member), []).append(
                            (module_name, f"{value.__qualname__}.{attribute}", member))
    return {key: _where_made(found) for key, found in candidates.items()}


def _where_made(candidates: list[tuple[str, str, Any]]) -> tuple[str, Any]:
    """The (module.NAME, cache) among `candidates` (one cache's names) for the module that makes it."""
    def made_there(module_name: str, name: str, cache: Any) -> bool:
        if hasattr(cache, "cache_info"):
            return getattr(cache, "__module__", None) == module_name
        source = getattr(sys.modules[module_name], "__file__", None)
        try:
            text = Path(source).read_text() if source else ""
        except OSError:
            return False
        return any(line.startswith((f"{name} =", f"{name}:")) for line in text.splitlines())

    module_name, name, cache = next((found for found in candidates if made_there(*found)), min(candidates))
    return f"{module_name}.{name}", cache


def attribute_caches(root: Any, root_name: str, depth: int = 6) -> dict[int, tuple[str, Any]]:
    """id -> (dotted path from `root_name`, cache) of the caches reachable from `root` through the
    attributes of the gateway's own objects (not into SQLAlchemy, LiteLLM, ...), `depth` steps at most."""
    found: dict[int, tuple[str, Any]] = {}
    visited: set[int] = set()
    layer = [(root_name, root)]
    for _ in range(depth + 1):
        following = []
        for path, value in layer:
            if id(value) in visited:
                continue
            visited.add(id(value))
            if is_cache(value):
                found.setdefault(id(value), (path, value))
                continue
            for name, child in _attributes(value):
                following.append((f"{path}.{name}", child))
        layer = following
    return found


def _attributes(value: Any) -> Iterator[tuple[str, Any]]:
    """The attributes of a gateway object, and the values of a dict of them (`services.policies`)."""
    if isinstance(value, dict):
        for key, child in value.items():
            if _project_module(type(child).__module__):
                yield f"[{key!r}]", child
        return
    if not _project_module(type(value).__module__):
        return
    attributes = dict(getattr(value, "__dict__", {}))
    for slot in itertools.chain.from_iterable(getattr(kind, "__slots__", ()) for kind in type(value).__mro__):
        if isinstance(slot, str) and hasattr(value, slot):
            attributes.setdefault(slot, getattr(value, slot))
    for name, child in attributes.items():
        if is_cache(child) or _project_module(type(child).__module__) or isinstance(child, dict):
            yield name, child


def named_caches(services: Any) -> list[tuple[str, Any]]:
    """Every cache this bench reports, with a name: the registered ones, then those that do not register."""
    from policies.memo import registered
    names = {**attribute_caches(services, "services"), **module_caches()}
    out: list[tuple[str, Any]] = []
    for cache in registered():
        name = names.pop(id(cache), None)
        out.append((name[0] if name else _fallback_name(cache), cache))
    out += list(names.values())
    return sorted(out, key=lambda pair: pair[0])


def _fallback_name(cache: Any) -> str:
    qualname = getattr(cache, "__qualname__", None)
    if qualname:
        return f"{getattr(cache, '__module__', '?')}.{qualname}"
    return f"{type(cache).__name__} at {id(cache):#x} (held by no module global or service attribute)"


def cache_rows(caches: Sequence[tuple[str, Any]], deep: bool) -> list[dict[str, Any]]:
    """Each cache's figures (`cache_figures`) and, `deep`, the bytes reachable from its contents."""
    rows = []
    for name, cache in caches:
        row = {"name": name, "kind": type(cache).__name__, **cache_figures(cache)}
        if deep:
            row["bytes"], row["bytes_capped"] = reachable_bytes(cache_contents(cache))
        rows.append(row)
    return rows


# --- where traced memory grows ---------------------------------------------------

def site_of(frames: Sequence[tracemalloc.Frame], repo: str = str(REPO)) -> str:
    """The innermost frame in the gateway's own code (else the innermost frame), as path:line."""
    prefixes = tuple(os.path.join(repo, folder) + os.sep for folder in PROJECT_FOLDERS)
    chosen = next((frame for frame in reversed(frames) if frame.filename.startswith(prefixes)), frames[-1])
    name = chosen.filename[len(repo) + 1:] if chosen.filename.startswith(repo + os.sep) else chosen.filename
    return f"{name}:{chosen.lineno}"


def traced_by_site(snapshot: tracemalloc.Snapshot) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for statistic in snapshot.statistics("traceback"):
        site = site_of(list(statistic.traceback))
        sizes[site] = sizes.get(site, 0) + statistic.size
    return sizes


def growth(before: Mapping[str, int], after: Mapping[str, int], top: int) -> list[tuple[str, int]]:
    """The `top` sites whose bytes grew most from `before` to `after`, largest first."""
    grown = [(site, size - before.get(site, 0)) for site, size in after.items()]
    return sorted((pair for pair in grown if pair[1] > 0), key=lambda pair: -pair[1])[:top]


# --- the process ------------------------------------------------------------------

def vm_rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) / 1024


def wait_for_outcomes(seconds: float = 10.0) -> None:
    """Until the gateway has written every outcome it took (its background writes), `seconds` at most."""
    from gateway.pipeline import run_recorder
    deadline = time.monotonic() + seconds
    while run_recorder._WRITING and time.monotonic() < deadline:
        time.sleep(0.05)


@dataclass
class Gateway:
    """The app in this process (uvicorn in a thread) in front of the constant upstream (a process)."""

    folder: Path
    storage_url: str | None = None  # None: SQLite in `folder`
    upstream: Any = None
    server: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    policy: str = "coding-agent"  # the tenant's

    def __enter__(self) -> "Gateway":
        import proxy_compare
        from gateway.app import create_app
        from gateway.config import parse_settings
        from testkit.fake_upstream import ServerThread
        self.upstream = proxy_compare.upstream_server(self.folder).start(60)
        settings = parse_settings({
            "models": [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": self.upstream.api_base,
                                                            "api_key": proxy_compare.UPSTREAM_KEY}}],
            "tenants": [{"id": "acme", "api_keys": [proxy_compare.TENANT_KEY], "policy": self.policy}],
            "storage": {"url": self.storage_url or f"sqlite:///{self.folder / 'gateway.db'}",
                        "blob_dir": str(self.folder / "blobs")},
            "log_level": "warning",
        }, "<bench>", str(self.folder))
        self.server = ServerThread(create_app(settings)).start()
        self.headers = {"content-type": "application/json", "authorization": f"Bearer {proxy_compare.TENANT_KEY}"}
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.server is not None:
            self.server.stop()
        if self.upstream is not None:
            self.upstream.stop()

    @property
    def api_base(self) -> str:
        return f"{self.server.url}/v1"

    def upstream_state(self) -> str:
        """Whether the upstream still runs, and the end of its log: where a request failed, why."""
        code = self.upstream.process.poll()
        state = "still runs" if code is None else f"exited with {code}"
        return f"the upstream (pid {self.upstream.process.pid}) {state}; its log ends:\n{self.upstream.log_tail()}"

    @property
    def services(self) -> Any:
        return self.server.server.config.app.state.services


async def _serve(api_base: str, headers: dict[str, str], numbers: Sequence[int], clients: int, messages: int,
                 requests: int) -> int:
    """Conversations `numbers`, `clients` at a time, each request after its previous answer; the
    requests sent. Anything but a 200 chat completion stops the run."""
    queue = iter(numbers)
    sent = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal sent
        for number in queue:
            session = conversation(number, messages, requests)
            for request in range(requests):
                response = await http.post("/chat/completions", content=request_body(session, messages, request))
                if response.status_code != 200 or b'"choices"' not in response.content:
                    raise RuntimeError(f"conversation {number}, request {request}: HTTP {response.status_code} "
                                       f"{response.text[:300]}")
                sent += 1

    async with httpx.AsyncClient(base_url=api_base, headers=headers, timeout=300, trust_env=False) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return sent


def serve(gateway: Gateway, numbers: Sequence[int], args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_serve(gateway.api_base, gateway.headers, numbers, args.clients, args.messages,
                                  args.requests))
    except RuntimeError as error:
        raise RuntimeError(f"{error}\n{gateway.upstream_state()}") from error


# --- a checkpoint ------------------------------------------------------------------

def settle() -> Callable[[], object] | None:
    """Wait for the gateway's background writes, collect; the trim to call (None where there is none)."""
    from gateway.ops.memory import MALLOC_TRIM
    wait_for_outcomes()
    time.sleep(0.2)
    gc.collect()
    return MALLOC_TRIM


def checkpoint(conversations: int, requests: int, seconds: float, services: Any, deep: bool) -> dict[str, Any]:
    trim = settle()
    traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else math.nan
    row: dict[str, Any] = {"conversations": conversations, "requests": requests, "seconds": seconds,
                           "traced_bytes": traced, "rss_mb": vm_rss_mb()}
    if trim is not None:
        trim()
    row["rss_trimmed_mb"] = vm_rss_mb()
    row["tracemalloc_mb"] = tracemalloc.get_tracemalloc_memory() / MIB
    caches = named_caches(services)
    row["caches"] = cache_rows(caches, deep)
    if deep:  # every cache at once: what they hold together, each object once
        row["in_caches_bytes"], _ = reachable_bytes(itertools.chain.from_iterable(
            cache_contents(cache) for _, cache in caches))
    return row


# --- printing ----------------------------------------------------------------------

def _num(value: float, digits: int = 1) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def outside_caches(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per row, the traced bytes not held by the caches: traced memory less what the caches came to hold
    since the first row (where tracing began); NaN where the caches were not measured."""
    first = rows[0].get("in_caches_bytes", math.nan)
    return [row["traced_bytes"] - (row.get("in_caches_bytes", math.nan) - first) for row in rows]


def summary_table(rows: Sequence[Mapping[str, Any]]) -> str:
    traced_each = per_conversation(rows, "traced_bytes")
    rss_each = per_conversation([{**row, "rss": row["rss_trimmed_mb"] * MIB} for row in rows], "rss")
    lines = [f"{'conversations':>13} {'requests':>8} {'seconds':>7} {'traced MB':>9} {'KB/conv':>8} "
             f"{'caches MB':>9} {'outside MB':>10} {'RSS MB':>7} {'trimmed':>7} {'RSS KB/conv':>11} {'tm MB':>6}"]
    for row, traced, outside, rss in zip(rows, traced_each, outside_caches(rows), rss_each):
        lines.append(f"{row['conversations']:>13} {row['requests']:>8} {_num(row['seconds']):>7} "
                     f"{_num(row['traced_bytes'] / MIB):>9} {_num(traced / 1024):>8} "
                     f"{_num(row.get('in_caches_bytes', math.nan) / MIB):>9} {_num(outside / MIB):>10} "
                     f"{_num(row['rss_mb']):>7} {_num(row['rss_trimmed_mb']):>7} {_num(rss / 1024):>11} "
                     f"{_num(row['tracemalloc_mb']):>6}")
    return "\n".join(lines)


def largest_caches(rows: Sequence[Mapping[str, Any]], count: int) -> list[str]:
    """The names of the `count` caches holding most at the last checkpoint (bytes where measured, else
    entries), largest first."""
    last = rows[-1]["caches"]
    return [cache["name"] for cache in sorted(last, key=lambda c: (-c.get("bytes", 0), -c["entries"]))[:count]]


def _bound_text(cache: Mapping[str, Any]) -> str:
    text = f"{cache['bound']:,}" if cache["bound"] else "-"
    if cache["max_weight"]:
        text += f" / {cache['max_weight'] / MIB:.0f}Mw" if cache["max_weight"] >= MIB else f" / {cache['max_weight']:,}w"
    return text


def _fill_text(cache: Mapping[str, Any] | None) -> str:
    if cache is None:
        return "-"
    if math.isnan(cache["fill"]):
        return f"{cache['entries']:,}"
    return f"{cache['fill'] * 100:.0f}%{'w' if cache['by_weight'] else ''}"


def at_bound_bytes(cache: Mapping[str, Any], least_fill: float = 0.05) -> float:
    """The bytes a cache would hold at its bound, its entries being like those it holds: bytes / fill
    (NaN below `least_fill`, where one conversation's entries would sway it, or unmeasured)."""
    fill = cache.get("fill", math.nan)
    if "bytes" not in cache or math.isnan(fill) or fill < least_fill:
        return math.nan
    return cache["bytes"] / min(fill, 1.0)


def cache_tables(rows: Sequence[Mapping[str, Any]], count: int) -> str:
    names = largest_caches(rows, count)
    by_row = [{cache["name"]: cache for cache in row["caches"]} for row in rows]
    last = by_row[-1]
    width = max(len(name) for name in names)
    heads = "".join(f"{'K=' + str(row['conversations']):>8}" for row in rows)
    lines = ["fill: entries / entry bound, or weight / weight bound (w) where that is the fuller",
             f"{'cache':<{width}} {'bound':>18} {'entries':>8}{heads}"]
    for name in names:
        lines.append(f"{name:<{width}} {_bound_text(last[name]):>18} {last[name]['entries']:>8,}"
                     + "".join(f"{_fill_text(caches.get(name)):>8}" for caches in by_row))
    if "bytes" not in last[names[0]]:
        return "\n".join(lines)
    lines += ["", "MB reachable from each cache's entries; `at bound`: the last over its fill",
              f"{'cache':<{width}} {'at bound':>8}{heads}"]
    for name in names:
        cells = "".join(f"{_num(caches[name]['bytes'] / MIB) if name in caches else '-':>8}" for caches in by_row)
        lines.append(f"{name:<{width}} {_num(at_bound_bytes(last[name]) / MIB):>8}{cells}")
    return "\n".join(lines)


def sites_table(row: Mapping[str, Any], previous: Mapping[str, Any]) -> str:
    lines = [f"traced growth by allocation site, K={previous['conversations']} -> K={row['conversations']} "
             f"(KB per conversation added)"]
    added = row["conversations"] - previous["conversations"]
    for site, size in row["sites"]:
        lines.append(f"  {size / 1024 / added:>9.1f}  {site}")
    return "\n".join(lines)


# --- main ------------------------------------------------------------------------

def measure(args: argparse.Namespace, checkpoints: Sequence[int]) -> list[dict[str, Any]]:
    """The rows: a baseline after the warm-up (K=0), then one per checkpoint."""
    deep, sites_shown = not args.no_deep, 0 if args.no_trace else args.sites
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="conversation-memory-") as folder, Gateway(Path(folder)) as gateway:
        serve(gateway, [WARM_UP], argparse.Namespace(**{**vars(args), "clients": 1}))
        gc.collect()
        if not args.no_trace:
            tracemalloc.start(args.frames)
        rows.append(checkpoint(0, 0, 0.0, gateway.services, deep))
        sites = traced_by_site(tracemalloc.take_snapshot()) if sites_shown else {}
        served, sent = 0, 0
        for target in checkpoints:
            started = time.monotonic()
            sent += serve(gateway, range(served, target), args)
            seconds = time.monotonic() - started
            served = target
            measuring = time.monotonic()
            row = checkpoint(served, sent, seconds, gateway.services, deep)
            if sites_shown:
                now = traced_by_site(tracemalloc.take_snapshot())
                row["sites"], sites = growth(sites, now, sites_shown), now
            row["measure_seconds"] = time.monotonic() - measuring
            rows.append(row)
            print(f"  K={served}: {row['traced_bytes'] / MIB:.1f} MB traced, {row['rss_trimmed_mb']:.0f} MB RSS "
                  f"(trimmed); {seconds:.0f} s serving, {row['measure_seconds']:.0f} s measuring", flush=True)
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    return rows


def finite(value: Any) -> Any:
    """`value` with every NaN made None: JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--checkpoints", type=int, nargs="+", help=f"counts of conversations to measure at "
                        f"(default {' '.join(map(str, DEFAULT_CHECKPOINTS))}; --quick {' '.join(map(str, QUICK_CHECKPOINTS))})")
    parser.add_argument("--messages", type=int, default=100, help="messages of a conversation's first request (100)")
    parser.add_argument("--requests", type=int, default=3, help="requests per conversation, a tool round more "
                        "each (3; --quick 2)")
    parser.add_argument("--clients", type=int, default=4, help="conversations served at a time (4)")
    parser.add_argument("--frames", type=int, default=1, help="frames tracemalloc keeps per allocation (1: "
                        "each frame more costs; 4 serve ~2.5x slower)")
    parser.add_argument("--caches", type=int, default=16, help="caches shown: the largest at the last checkpoint")
    parser.add_argument("--sites", type=int, default=10, help="allocation sites shown (0: no snapshots)")
    parser.add_argument("--no-deep", action="store_true", help="skip the MB reachable from each cache")
    parser.add_argument("--no-trace", action="store_true", help="no tracemalloc (nor sites): RSS without its "
                        "bookkeeping, the gateway ~30%% faster; with --no-deep, nothing of the measuring in the RSS")
    parser.add_argument("--quick", action="store_true", help=f"checkpoints {QUICK_CHECKPOINTS}, 2 requests each")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    if args.quick and args.requests == parser.get_default("requests"):
        args.requests = 2
    checkpoints = parse_checkpoints(args.checkpoints or (QUICK_CHECKPOINTS if args.quick else DEFAULT_CHECKPOINTS))
    print(f"command: {' '.join(sys.argv)}")
    print(f"conversations of {args.messages} messages, then {args.requests - 1} more request(s) of a tool round "
          f"more each; {args.clients} at a time; checkpoints {checkpoints}")
    began = time.monotonic()
    rows = measure(args, checkpoints)
    print(f"\nwall time {time.monotonic() - began:.0f} s\n")
    print(summary_table(rows))
    print()
    print(cache_tables(rows, args.caches))
    if len(rows) > 1 and "sites" in rows[-1]:
        print()
        print(sites_table(rows[-1], rows[-2]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
        args.json.write_text(json.dumps(finite({"command": sys.argv, "settings": settings, "rows": rows}), indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
