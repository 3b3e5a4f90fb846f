"""`gateway replay TRACE...`: run agent traces through the assembler offline.

For each assistant message i of a trace, the agent's request was
messages[:i]; each is projected as the gateway would project it, and the
figures users choose a policy by are printed: tokens as sent and as
forwarded, peak context, the share of each forwarded prompt that repeats the
previous one's prefix (what a provider's prompt cache reads), and the cost
relative to a cached replay of the client's own transcript.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from policies.assembler import assemble
from policies.assembly_types import Projection
from policies.path_records import records_for_path
from policies.policy import Policy
from policies.protocol import orphan_tool_messages
from policies.tokens import message_tokens
from policies.transcript import message_path

REPLAY_TENANT = "replay"
_WIRE_FIELDS = ("role", "content", "tool_calls", "tool_call_id", "name")


@dataclass(frozen=True)
class CachePrices:
    """Prices relative to an uncached input token (Anthropic-style by default)."""

    read: float = 0.1
    write: float = 1.25
    usd_per_mtok: float = 3.0  # an uncached input token, in USD per million (for the dollar figures)


class TraceError(ValueError):
    """A trace file that cannot be replayed: said in one line naming the file."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")


def load_trace(path: str | Path) -> dict[str, Any]:
    """A trace: a JSON object (or the first line of a JSONL file) whose `messages` is a list of messages."""
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(path, f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        trace = json.loads(text)
    except json.JSONDecodeError:
        try:
            trace = json.loads(text.splitlines()[0]) if text else None
        except json.JSONDecodeError as exc:
            raise TraceError(path, f"is neither JSON nor JSONL (line 1, column {exc.colno}: {exc.msg})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("messages"), list):
        raise TraceError(path, "holds no `messages` list (a trace is {\"messages\": [...]}, or one such object "
                               "per JSONL line)")
    for index, message in enumerate(trace["messages"]):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise TraceError(path, f"messages[{index}] is not a message with a `role`")
    return trace


def wire_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as it travels: the fields providers read, `content` always present on assistants."""
    out = {k: v for k, v in message.items() if k in _WIRE_FIELDS}
    if out.get("role") == "assistant":
        out.setdefault("content", None)
    return out


def trace_turns(trace: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[int]]:
    messages = [wire_message(m) for m in trace["messages"]]
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i > 0]
    return messages, turns


def protocol_problems(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Orphan tool messages, and calls left without an answer."""
    problems = [reason for _, reason in orphan_tool_messages(messages)]
    open_calls: set[str] = set()
    for message in messages:
        if message.get("role") == "assistant":
            if open_calls:
                problems.append(f"unanswered calls {sorted(open_calls)}")
            open_calls = {c.get("id") for c in message.get("tool_calls") or []}
        elif message.get("role") == "tool":
            open_calls.discard(message.get("tool_call_id"))
        elif open_calls:
            problems.append(f"unanswered calls {sorted(open_calls)} before a {message.get('role')} message")
            open_calls = set()
    if open_calls:
        problems.append(f"unanswered calls {sorted(open_calls)} at the end")
    return problems


def prefix_tokens(previous: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]) -> int:
    """Tokens of the longest common message prefix: what a prefix cache reads."""
    total = 0
    for a, b in zip(previous, current):
        if a != b:
            break
        total += message_tokens(b)
    return total


def _trailing_tools(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    out = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        out.append(message)
    return out[::-1]


@dataclass
class TurnFigures:
    sent: int
    forwarded: int
    cached: int
    problems: list[str]
    latest_round_kept: bool
    user_system_kept: bool


@dataclass
class TraceReport:
    name: str
    turns: list[TurnFigures] = field(default_factory=list)
    tool_calls: int = 0

    def summary(self, prices: CachePrices) -> dict[str, Any]:
        sent = sum(t.sent for t in self.turns)
        forwarded = sum(t.forwarded for t in self.turns)
        cached = sum(t.cached for t in self.turns)
        cost = sum(t.cached * prices.read + (t.forwarded - t.cached) * prices.write for t in self.turns)
        replay_cost, previous = 0.0, 0
        for t in self.turns:  # the client's own transcript only grows: its prefix is the previous request
            replay_cost += previous * prices.read + (t.sent - previous) * prices.write
            previous = t.sent
        peak_sent = max((t.sent for t in self.turns), default=0)
        peak_forwarded = max((t.forwarded for t in self.turns), default=0)
        return {
            "trace": self.name,
            "turns": len(self.turns),
            "tool_calls": self.tool_calls,
            "sent_tokens": sent,
            "forwarded_tokens": forwarded,
            "reduction": round(1 - forwarded / sent, 4) if sent else 0.0,
            "peak_sent": peak_sent,
            "peak_forwarded": peak_forwarded,
            "peak_ratio": round(peak_forwarded / peak_sent, 4) if peak_sent else 0.0,
            "prefix_reuse": round(cached / forwarded, 4) if forwarded else 0.0,
            "cost_vs_cached_replay": round(cost / replay_cost, 4) if replay_cost else 0.0,
            "input_usd": round(cost * prices.usd_per_mtok / 1e6, 6),
            "replay_input_usd": round(replay_cost * prices.usd_per_mtok / 1e6, 6),
            "protocol_violations": sum(len(t.problems) for t in self.turns),
            "latest_round_lost": sum(1 for t in self.turns if not t.latest_round_kept),
            "user_system_lost": sum(1 for t in self.turns if not t.user_system_kept),
        }


def turn_figures(sent: Sequence[Mapping[str, Any]], forwarded: Sequence[Mapping[str, Any]],
                 previous: Sequence[Mapping[str, Any]] | None) -> TurnFigures:
    sent_wire = [wire_message(m) for m in sent]
    forwarded_wire = [wire_message(m) for m in forwarded]
    return TurnFigures(
        sent=sum(message_tokens(m) for m in sent_wire),
        forwarded=sum(message_tokens(m) for m in forwarded_wire),
        cached=prefix_tokens(previous, forwarded_wire) if previous is not None else 0,
        problems=protocol_problems(forwarded_wire),
        latest_round_kept=all(m in forwarded_wire for m in _trailing_tools(sent_wire)),
        user_system_kept=all(m in forwarded_wire for m in sent_wire if m["role"] in ("system", "user")),
    )


def replay_trace(
    policy: Policy,
    trace: Mapping[str, Any],
    name: str,
    *,
    tenant: str = REPLAY_TENANT,
    on_projection: Callable[[list[dict[str, Any]], Projection], None] | None = None,
) -> TraceReport:
    """Project each turn of `trace` as the gateway would for `tenant` (ids depend on the tenant)."""
    messages, turns = trace_turns(trace)
    report = TraceReport(name=name, tool_calls=sum(len(m.get("tool_calls") or []) for m in messages))
    previous: list[dict[str, Any]] | None = None
    for i in turns:
        request = messages[:i]
        path = message_path(tenant, request)
        projection = assemble(policy, request, records_for_path(path, now=0.0), now=0.0)
        if on_projection is not None:
            on_projection(request, projection)
        figures = turn_figures(request, projection.messages, previous)
        report.turns.append(figures)
        previous = [wire_message(m) for m in projection.messages]
    return report


def totals(summaries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    rows = list(summaries)
    sent = sum(r["sent_tokens"] for r in rows)
    forwarded = sum(r["forwarded_tokens"] for r in rows)
    big = [r for r in rows if r["tool_calls"] >= 20]
    return {
        "traces": len(rows),
        "sent_tokens": sent,
        "forwarded_tokens": forwarded,
        "reduction": round(1 - forwarded / sent, 4) if sent else 0.0,
        "input_usd": round(sum(r.get("input_usd", 0.0) for r in rows), 6),
        "replay_input_usd": round(sum(r.get("replay_input_usd", 0.0) for r in rows), 6),
        "max_cost_vs_cached_replay": max((r["cost_vs_cached_replay"] for r in rows), default=0.0),
        "median_cost_20plus": statistics.median(r["cost_vs_cached_replay"] for r in big) if big else None,
        "median_peak_ratio_20plus": statistics.median(r["peak_ratio"] for r in big) if big else None,
        "protocol_violations": sum(r["protocol_violations"] for r in rows),
        "latest_round_lost": sum(r["latest_round_lost"] for r in rows),
        "user_system_lost": sum(r["user_system_lost"] for r in rows),
    }


def format_table(rows: Sequence[Mapping[str, Any]], total: Mapping[str, Any]) -> str:
    header = (f"{'trace':<52} {'turns':>5} {'calls':>5} {'sent':>9} {'fwd':>8} {'cut':>6} "
              f"{'peak':>7} {'peakfwd':>7} {'peak x':>6} {'reuse':>6} {'cost x':>6} {'viol':>4}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['trace'][:52]:<52} {r['turns']:>5} {r['tool_calls']:>5} {r['sent_tokens']:>9} "
            f"{r['forwarded_tokens']:>8} {r['reduction']:>6.1%} {r['peak_sent']:>7} {r['peak_forwarded']:>7} "
            f"{r['peak_ratio']:>6.2f} {r['prefix_reuse']:>6.1%} {r['cost_vs_cached_replay']:>6.3f} "
            f"{r['protocol_violations']:>4}"
        )
    lines.append("-" * len(header))
    lines.append(
        f"{'TOTAL':<52} {'':>5} {'':>5} {total['sent_tokens']:>9} {total['forwarded_tokens']:>8} "
        f"{total['reduction']:>6.1%}"
    )
    median_cost = total["median_cost_20plus"]
    median_peak = total["median_peak_ratio_20plus"]
    lines.append(
        f"cost x (cached, vs cached replay): max {total['max_cost_vs_cached_replay']:.3f}"
        + (f", median over traces with 20+ tool calls {median_cost:.3f}" if median_cost is not None else "")
        + (f"; peak x median (20+ calls) {median_peak:.3f}" if median_peak is not None else "")
    )
    lines.append(
        f"protocol violations {total['protocol_violations']}, latest round lost {total['latest_round_lost']}, "
        f"system/user lost {total['user_system_lost']}"
    )
    if "input_usd" in total:
        saved = total["replay_input_usd"] - total["input_usd"]
        lines.append(f"input cost: ${total['input_usd']:.4f} projected against ${total['replay_input_usd']:.4f} "
                     f"replayed (cached), ${saved:.4f} saved")
    return "\n".join(lines)


LEGEND = """\
columns:
  turns    requests replayed (one per assistant message after the first message)
  calls    tool calls in the trace
  sent     prompt tokens the agent sent, summed over its requests (counted here with tiktoken o200k_base)
  fwd      prompt tokens the gateway would forward under the policy, summed
  cut      1 - fwd/sent: the share of prompt tokens not forwarded
  peak     the largest single request as sent; peakfwd: the same request as forwarded
  peak x   peakfwd / peak: how much of the largest context the model gets
  reuse    share of forwarded tokens that repeat the previous request's prefix (what a prompt cache reads)
  cost x   input cost of the projection against a cached replay of the agent's own transcript, with cache
           reads at --cache-read and cache writes at --cache-write of an uncached token (below 1: cheaper)
  viol     requests whose projection breaks the wire protocol (a call without its answer; must be 0)"""
