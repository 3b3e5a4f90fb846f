"""The rehydration tool declared mid-conversation on Anthropic upstreams, where the first memory appears.

Anthropic's prompt cache hashes the tool list before everything else. Declaring
`gateway_rehydrate` in `tools` therefore costs either its tokens on every request
from the first one on (the tool list must not change later), or, declared when
the first memory appears, one miss of the whole cached conversation. Anthropic's
mid-conversation tool changes remove that choice: a `role: "system"` message
holding a `tool_addition` block adds a tool at the point of the conversation
where it becomes relevant, and the prefix before it stays cached:

    {"role": "system", "content": [{"type": "tool_addition",
      "tool": {"type": "tool_definition", "definition": {name, description, input_schema}}}]}

under the betas `mid-conversation-tool-changes-2026-07-01` and
`inline-tools-2026-09-15` (a tool defined by value). The gateway puts it right
after the first message its projection changes (a compaction rewrites the
prompt from there anyway), so a conversation that never compacts never
declares the tool, and one that does pays for it once, at its first move.

A model or endpoint without the feature answers 400: the request is sent again
with the tool in `tools` instead (`as_declared_tools`) and the deployment is
remembered (gateway/upstream/litellm_client/client.py), so its later requests declare the tool
that way without asking again.
"""
from __future__ import annotations

from typing import Any, Mapping

BETAS = ("mid-conversation-tool-changes-2026-07-01", "inline-tools-2026-09-15")
BETA_HEADER = "anthropic-beta"


def addition_message(definition: Mapping[str, Any]) -> dict[str, Any]:
    """The `role: "system"` message that adds the tool `definition` (Anthropic's tool shape)."""
    return {"role": "system", "content": [{"type": "tool_addition",
                                           "tool": {"type": "tool_definition", "definition": dict(definition)}}]}


def is_addition(message: Any) -> bool:
    return (isinstance(message, dict) and message.get("role") == "system" and isinstance(message.get("content"), list)
            and any(isinstance(b, dict) and b.get("type") == "tool_addition" for b in message["content"]))


def insert_at(rendered: list[dict[str, Any]], holder: int) -> int:
    """Where the addition goes, given the rendered message `holder` that holds the first changed block:
    after it when it is a user turn (a tool_result turn must follow its tool_use turn directly), else
    before it; never last, since a request ends with the turn the model answers."""
    if rendered[holder].get("role") == "user":
        if holder + 1 < len(rendered):
            return holder + 1
        before = holder - 1
        if before >= 0 and rendered[before].get("role") == "assistant" and _has_tool_use(rendered[before]):
            return before
    return holder


def _has_tool_use(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)


def with_betas(headers: Mapping[str, str]) -> dict[str, str]:
    """`headers` with the feature's betas added to the client's `anthropic-beta` list."""
    out = dict(headers)
    present = [b.strip() for b in (out.get(BETA_HEADER) or "").split(",") if b.strip()]
    out[BETA_HEADER] = ",".join([*present, *(b for b in BETAS if b not in present)])
    return out


def without_betas(headers: Mapping[str, str]) -> dict[str, str]:
    out = dict(headers)
    kept = [b.strip() for b in (out.get(BETA_HEADER) or "").split(",") if b.strip() and b.strip() not in BETAS]
    if kept:
        out[BETA_HEADER] = ",".join(kept)
    else:
        out.pop(BETA_HEADER, None)
    return out


def has_additions(body: Mapping[str, Any]) -> bool:
    return any(is_addition(m) for m in body.get("messages") or [])


def as_declared_tools(body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` with every tool it adds mid-conversation declared in `tools` instead (the fallback for a
    model without the feature). Cache markers the removed messages carried are dropped with them."""
    added = [b["tool"]["definition"] for m in body.get("messages") or [] if is_addition(m)
             for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_addition"]
    out = dict(body)
    out["messages"] = [m for m in body.get("messages") or [] if not is_addition(m)]
    names = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
    out["tools"] = [*(body.get("tools") or []), *(d for d in added if d.get("name") not in names)]
    return out
