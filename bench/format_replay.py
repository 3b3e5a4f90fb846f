"""The agent traces in every wire format: the same savings, and what Anthropic's cache markers cost.

    .venv/bin/python bench/format_replay.py [--policy coding-agent] [--json] [--context-management [JSON]]

Every trace in tests/data/traces is converted to Anthropic Messages requests
(system, user turns, assistant turns with tool_use blocks, tool_result blocks)
and to Responses items (instructions, messages, function_call and
function_call_output items), and replayed turn by turn, four ways, against the
fake upstream (whose /v1/messages caches only up to `cache_control` markers:
reads 0.1x, writes 1.25x of an input token):
- through the gateway's /v1/messages, the client marking its system prompt and
  the last block of each request as Claude Code does (the gateway keeps the
  first and places its own in the messages);
- straight to the upstream with those same client markers (the client's own replay);
- the Chat form of the same trace through the gateway's /v1/chat/completions;
- the Responses form through the gateway's /v1/responses;
- the Gemini form (systemInstruction, contents with functionCall and functionResponse
  parts under the trace's call ids) through the gateway's generateContent, to a
  Gemini deployment on the fake's /v1beta routes.
With --context-management both Anthropic replays (the gateway's and the client's own) ask the
provider for context editing (`context_management`, with its beta header; by default Claude Code's
edits scaled to these traces: `CONTEXT_MANAGEMENT`), which the fake applies before it caches or counts
(gateway/fake_upstream/context_edits.py); the other formats are not replayed then.
It prints per trace the forwarded-token reduction in every format, the prompt
cost of the gateway against the client's own Anthropic replay, and invalid
requests (a call not answered by its result, in either format); then the
reduction of each format over every trace together.

On Anthropic the rehydration tool is added where the first memory appears
(gateway/pipeline/tool_additions.py), so a conversation's first compaction must also pay
for the tool's tokens: a trace whose only candidate saves less than that (the
minisweagent one) is not compacted there, and its reduction differs from the
Chat path's, where the tool is declared from the first request whatever happens.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
from gateway.upstream.encodings import use_bundled_encodings  # noqa: E402

use_bundled_encodings()

import httpx  # noqa: E402

from testkit.gateway import TENANT_KEY, settings_for, start_gateway  # noqa: E402
from testkit.fake_upstream import FakeUpstream  # noqa: E402

TRACES = REPO / "tests" / "data" / "traces"
MODEL = "claude-sonnet-4-5"
GEMINI_MODEL = "gemini-2.5-flash"
MARKER = {"type": "ephemeral"}
READ, WRITE = 0.1, 1.25
# Claude Code's edits (thinking kept; old tool results cleared past a trigger, the latest kept, in
# batches worth a cache miss), its 180k-token trigger scaled to traces of 2.5k to 25k tokens.
CONTEXT_MANAGEMENT = {"edits": [
    {"type": "clear_thinking_20251015", "keep": "all"},
    {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 5000},
     "keep": {"type": "tool_uses", "value": 3}, "clear_at_least": {"type": "input_tokens", "value": 1000}}]}
MANAGED_BETA = {"anthropic-beta": "context-management-2025-06-27"}


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8").splitlines()[0])


def turns(messages: list[dict[str, Any]]) -> list[int]:
    """The requests an agent sends: one before each assistant message that has a user turn before it."""
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant"
            and any(p.get("role") not in ("system", "developer") for p in messages[:i])]


def to_anthropic(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """A Chat transcript as Anthropic's system and messages (tool results open the next user turn)."""
    system = None
    out: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message.get("content")
        if role == "system":
            system = content if system is None else f"{system}\n{content}"
        elif role == "assistant":
            blocks = [{"type": "text", "text": content}] if content else []
            for call in message.get("tool_calls") or []:
                try:
                    arguments = json.loads(call["function"]["arguments"] or "{}")
                except ValueError:
                    arguments = {"arguments": call["function"]["arguments"]}
                if not isinstance(arguments, dict):
                    arguments = {"value": arguments}
                blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                               "input": arguments})
            out.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "..."}]})
        elif role == "tool":
            block = {"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": content or ""}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list) and all(
                    b.get("type") == "tool_result" for b in out[-1]["content"]):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        else:
            text = content if isinstance(content, str) else json.dumps(content)
            if out and out[-1]["role"] == "user":
                out[-1]["content"] = [*out[-1]["content"], {"type": "text", "text": text or "..."}] \
                    if isinstance(out[-1]["content"], list) else [{"type": "text", "text": out[-1]["content"]},
                                                                  {"type": "text", "text": text or "..."}]
            else:
                out.append({"role": "user", "content": text or "..."})
    return system, out


def to_responses(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """A Chat transcript as Responses instructions and input items."""
    instructions = None
    items: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message.get("content")
        if role == "system" and instructions is None and not items:
            instructions = content
        elif role == "assistant":
            if content:
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": content}]})
            for call in message.get("tool_calls") or []:
                items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                              "arguments": call["function"]["arguments"] or "{}"})
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"], "output": content or ""})
        else:
            text = content if isinstance(content, str) else json.dumps(content)
            items.append({"role": "user" if role != "system" else "system", "content": text or "..."})
    return instructions, items


def to_gemini(messages: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """A Chat transcript as Gemini's systemInstruction and contents (a turn's results in one user content)."""
    system = None
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for message in messages:
        role, content = message["role"], message.get("content")
        text = content if isinstance(content, str) or content is None else json.dumps(content)
        if role == "system" and system is None and not contents:
            system = {"parts": [{"text": text or "..."}]}
        elif role == "assistant":
            parts: list[dict[str, Any]] = [{"text": text}] if text else []
            for call in message.get("tool_calls") or []:
                names[call["id"]] = call["function"]["name"]
                try:
                    args = json.loads(call["function"]["arguments"] or "{}")
                except ValueError:
                    args = {"arguments": call["function"]["arguments"]}
                parts.append({"functionCall": {"id": call["id"], "name": call["function"]["name"],
                                               "args": args if isinstance(args, dict) else {"value": args}}})
            contents.append({"role": "model", "parts": parts or [{"text": "..."}]})
        elif role == "tool":
            call_id = message["tool_call_id"]
            part = {"functionResponse": {"id": call_id, "name": names.get(call_id, "tool"),
                                         "response": {"output": text or ""}}}
            if contents and contents[-1]["role"] == "user" and "functionResponse" in contents[-1]["parts"][0]:
                contents[-1]["parts"].append(part)
            else:
                contents.append({"role": "user", "parts": [part]})
        else:
            contents.append({"role": "user", "parts": [{"text": text or "..."}]})
    return system, contents


def unpaired_gemini(body: dict[str, Any]) -> int:
    """Gemini contents: a functionCall turn not answered call for call by the next turn, or answers elsewhere."""
    problems = 0
    contents = body["contents"]
    for index, content in enumerate(contents):
        calls = [p["functionCall"].get("id") for p in content["parts"] if "functionCall" in p]
        answers = [p["functionResponse"].get("id") for p in content["parts"] if "functionResponse" in p]
        before = [p["functionCall"].get("id") for p in contents[index - 1]["parts"] if "functionCall" in p] \
            if index else []
        if content["role"] == "model" and calls:
            following = contents[index + 1]["parts"] if index + 1 < len(contents) else []
            problems += calls != [p["functionResponse"].get("id") for p in following if "functionResponse" in p]
        elif answers and answers != before:
            problems += 1
    return problems


def unpaired(body: dict[str, Any]) -> int:
    """Responses input items: calls without an output after them, outputs without a call before them."""
    open_calls: set[str] = set()
    problems = 0
    for item in body["input"]:
        if item.get("type") == "function_call":
            open_calls.add(item["call_id"])
        elif item.get("type") == "function_call_output":
            problems += item["call_id"] not in open_calls
            open_calls.discard(item["call_id"])
    return problems + len(open_calls)


def tools_of(trace: dict[str, Any]) -> list[dict[str, Any]]:
    names = sorted({c["function"]["name"] for m in trace["messages"] for c in m.get("tool_calls") or []})
    return [{"name": n, "description": f"the {n} tool", "input_schema": {"type": "object"}} for n in names]


def claude_code_markers(body: dict[str, Any]) -> dict[str, Any]:
    """The client's markers as Claude Code sets them: its system prompt, and the last block of the request."""
    out = json.loads(json.dumps(body))
    if out.get("system"):
        out["system"] = [{"type": "text", "text": out["system"], "cache_control": MARKER}]
    last = out["messages"][-1]
    if isinstance(last["content"], str):
        last["content"] = [{"type": "text", "text": last["content"]}]
    last["content"][-1]["cache_control"] = MARKER
    return out


def prompt_cost(usage: dict[str, Any]) -> float:
    return (usage.get("input_tokens", 0) + WRITE * usage.get("cache_creation_input_tokens", 0)
            + READ * usage.get("cache_read_input_tokens", 0))


def invalid(body: dict[str, Any]) -> int:
    problems = 0
    messages = body["messages"]
    for index, message in enumerate(messages):
        uses = {b["id"] for b in message["content"] if isinstance(message["content"], list)
                and b.get("type") == "tool_use"} if message["role"] == "assistant" else set()
        if uses:
            following = messages[index + 1]["content"] if index + 1 < len(messages) else []
            answered = {b.get("tool_use_id") for b in following if isinstance(b, dict)
                        and b.get("type") == "tool_result"} if isinstance(following, list) else set()
            problems += uses != answered
    return problems


def replay_trace(gateway_url: str, fake: FakeUpstream, trace: dict[str, Any], name: str,
                 managed: dict[str, Any] | None = None) -> dict[str, Any]:
    system, _ = to_anthropic(trace["messages"])
    tools = tools_of(trace)
    row: dict[str, Any] = {"trace": name, "turns": 0}
    gateway_cost = direct_cost = 0.0
    sent = {"anthropic": 0, "chat": 0, "responses": 0, "gemini": 0}
    forwarded = {"anthropic": 0, "chat": 0, "responses": 0, "gemini": 0}
    bad = 0
    label = {"x-gateway-session": f"bench-{name}"}
    extra = {"context_management": managed} if managed else {}
    beta = MANAGED_BETA if managed else {}
    with httpx.Client(timeout=120) as http:
        fake.reset()
        for end in turns(trace["messages"]):
            _, messages = to_anthropic(trace["messages"][:end])
            body = {"model": MODEL, "max_tokens": 1024, "messages": messages, "tools": tools,
                    **({"system": system} if system else {}), **extra}
            response = http.post(f"{gateway_url}/v1/messages", json=claude_code_markers(body),
                                 headers={"x-api-key": TENANT_KEY, **label, **beta})
            response.raise_for_status()
            gateway_cost += prompt_cost(response.json()["usage"])
            sent["anthropic"] += int(response.headers["x-gateway-tokens-original"])
            forwarded["anthropic"] += int(response.headers["x-gateway-tokens-forwarded"])
            bad += invalid(fake.requests[-1]["body"])
            row["turns"] += 1
        fake.reset()
        for end in turns(trace["messages"]):
            _, messages = to_anthropic(trace["messages"][:end])
            body = {"model": MODEL, "max_tokens": 1024, "messages": messages, "tools": tools,
                    **({"system": system} if system else {}), **extra}
            response = http.post(f"{fake.url}/v1/messages", json=claude_code_markers(body), headers=beta)
            direct_cost += prompt_cost(response.json()["usage"])
        if managed:
            row.update(cost_vs_client=round(gateway_cost / direct_cost, 4) if direct_cost else 1.0,
                       gateway_cost=round(gateway_cost, 1), client_cost=round(direct_cost, 1),
                       invalid_requests=bad, tool_calls=sum(len(m.get("tool_calls") or []) for m in trace["messages"]))
            return row
        fake.reset()
        for end in turns(trace["messages"]):
            body = {"model": "fake", "messages": trace["messages"][:end]}
            response = http.post(f"{gateway_url}/v1/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {TENANT_KEY}", **label})
            response.raise_for_status()
            sent["chat"] += int(response.headers["x-gateway-tokens-original"])
            forwarded["chat"] += int(response.headers["x-gateway-tokens-forwarded"])
        fake.reset()
        functions = [{"type": "function", "name": t["name"], "parameters": t["input_schema"]} for t in tools]
        for end in turns(trace["messages"]):
            instructions, items = to_responses(trace["messages"][:end])
            body = {"model": "fake", "input": items, "tools": functions,
                    **({"instructions": instructions} if instructions else {})}
            response = http.post(f"{gateway_url}/v1/responses", json=body,
                                 headers={"Authorization": f"Bearer {TENANT_KEY}", **label})
            response.raise_for_status()
            sent["responses"] += int(response.headers["x-gateway-tokens-original"])
            forwarded["responses"] += int(response.headers["x-gateway-tokens-forwarded"])
            bad += unpaired(fake.requests[-1]["body"])
        fake.reset()
        declarations = [{"functionDeclarations": [{"name": t["name"], "description": t["description"],
                                                   "parametersJsonSchema": t["input_schema"]} for t in tools]}]
        for end in turns(trace["messages"]):
            instruction, contents = to_gemini(trace["messages"][:end])
            body = {"contents": contents, **({"tools": declarations} if tools else {}),
                    **({"systemInstruction": instruction} if instruction else {})}
            response = http.post(f"{gateway_url}/v1beta/models/{GEMINI_MODEL}:generateContent", json=body,
                                 headers={"x-goog-api-key": TENANT_KEY, **label})
            response.raise_for_status()
            sent["gemini"] += int(response.headers["x-gateway-tokens-original"])
            forwarded["gemini"] += int(response.headers["x-gateway-tokens-forwarded"])
            bad += unpaired_gemini(fake.requests[-1]["body"])
    calls = sum(len(m.get("tool_calls") or []) for m in trace["messages"])
    row.update(
        tool_calls=calls,
        reduction_anthropic=round(1 - forwarded["anthropic"] / sent["anthropic"], 4),
        reduction_chat=round(1 - forwarded["chat"] / sent["chat"], 4),
        reduction_responses=round(1 - forwarded["responses"] / sent["responses"], 4),
        reduction_gemini=round(1 - forwarded["gemini"] / sent["gemini"], 4),
        cost_vs_client=round(gateway_cost / direct_cost, 4) if direct_cost else 1.0,
        tokens_sent=sent, tokens_forwarded=forwarded,
        invalid_requests=bad,
    )
    return row


def run(policy: str = "coding-agent", managed: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    rows = []
    with FakeUpstream() as fake, tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        models = [{"name": "claude-*", "litellm_params": {"model": "anthropic/claude-*", "api_base": fake.url,
                                                           "api_key": "sk-upstream"}},
                  {"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": fake.api_base,
                                                       "api_key": "sk-upstream"}},
                  {"name": "gemini-*", "litellm_params": {"model": "gemini/gemini-*", "api_base": f"{fake.url}/v1beta",
                                                           "api_key": "sk-upstream"}}]
        tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": policy}]
        settings = settings_for(fake.api_base, f"sqlite:///{tmp / 'bench.db'}", tmp, models=models, tenants=tenants)
        gateway, server = start_gateway(settings, fake)
        try:
            for path in sorted(TRACES.glob("*.jsonl")):
                rows.append(replay_trace(gateway.url, fake, load(path), path.stem, managed))
        finally:
            server.stop()
    return rows


def gap(row: dict[str, Any]) -> float:
    """The largest difference between a format's reduction and the Chat path's."""
    return max(abs(row["reduction_anthropic"] - row["reduction_chat"]),
               abs(row["reduction_responses"] - row["reduction_chat"]),
               abs(row["reduction_gemini"] - row["reduction_chat"]))


def total_reduction(rows: list[dict[str, Any]], wire: str) -> float:
    """The forwarded-token reduction of a format over every trace together."""
    return 1 - sum(r["tokens_forwarded"][wire] for r in rows) / sum(r["tokens_sent"][wire] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="coding-agent")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--context-management", nargs="?", const=json.dumps(CONTEXT_MANAGEMENT), default=None,
                        metavar="JSON", help="ask the provider for context editing (default: CONTEXT_MANAGEMENT)")
    args = parser.parse_args()
    managed = json.loads(args.context_management) if args.context_management else None
    rows = run(args.policy, managed)
    if args.json or managed:
        for row in rows:
            print(json.dumps(row))
    if managed:
        costs = [r["cost_vs_client"] for r in rows]
        total = sum(r["gateway_cost"] for r in rows) / sum(r["client_cost"] for r in rows)
        print(f"context management {json.dumps(managed)}: cost vs the client's own replay: max {max(costs):.3f}, "
              f"median {statistics.median(costs):.3f}, all traces {total:.3f}; "
              f"invalid requests {sum(r['invalid_requests'] for r in rows)}")
    if args.json or managed:
        return
    print(f"command: {' '.join(sys.argv)}; policy {args.policy}; cache reads {READ}x, writes {WRITE}x")
    print(f"{'trace':<52} {'turns':>5} {'calls':>5} {'cut chat':>9} {'cut msgs':>9} {'cut resp':>9} {'cut gem':>9} "
          f"{'max pp':>7} {'cost vs client':>15} {'invalid':>8}")
    for row in rows:
        print(f"{row['trace']:<52} {row['turns']:>5} {row['tool_calls']:>5} {row['reduction_chat']:>9.1%} "
              f"{row['reduction_anthropic']:>9.1%} {row['reduction_responses']:>9.1%} {row['reduction_gemini']:>9.1%} "
              f"{gap(row) * 100:>7.2f} "
              f"{row['cost_vs_client']:>15.3f} {row['invalid_requests']:>8}")
    heavy = [r["cost_vs_client"] for r in rows if r["tool_calls"] >= 20]
    totals = {wire: total_reduction(rows, wire) for wire in ("chat", "anthropic", "responses", "gemini")}
    print("reduction over every trace: " + ", ".join(f"{wire} {value:.2%}" for wire, value in totals.items()))
    print(f"cost vs the client's own replay: max {max(r['cost_vs_client'] for r in rows):.3f}, median over "
          f"traces with 20+ tool calls {statistics.median(heavy):.3f}; largest reduction gap to the Chat path "
          f"{max(gap(r) for r in rows) * 100:.2f} pp; invalid requests "
          f"{sum(r['invalid_requests'] for r in rows)}")


if __name__ == "__main__":
    main()
