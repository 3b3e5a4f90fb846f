"""The assembler's records for a request path, built the same way online and offline.

The gateway passes what only the store knows (when each artifact was first
observed, by whom); `gateway replay` passes nothing and every artifact is
observed "now". Ids, statuses and token counts come from the path itself, so
both paths give the assembler identical inputs for identical transcripts.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from policies.assembly_types import Records
from policies.memories import ArtifactView
from policies.bounded_cache import BoundedCache, view_text, views_cache
from policies.rounds import last_positions
from policies.tokens import DEFAULT_ENCODING, count_text, message_tokens
from policies.tool_status import message_status
from policies.transcript import PathNode, arguments_artifact_id, artifact_id_for, tool_result_bytes


_FACTS = BoundedCache(65536)  # (node id, encoding) -> (sha256, status, tokens) of a tool message


def _facts(node: PathNode, encoding: str) -> tuple[str, str, str, int]:
    """(text, sha256, status, tokens) of a tool message.

    A node id names its content, so sha256, status and tokens never change for a node;
    agents re-send the same results every turn, and those are computed once per process
    (a bounded cache of small values, never the texts).
    """
    raw, _ = tool_result_bytes(node.message.get("content"))
    text = raw.decode("utf-8", "replace")  # as the store reads it back (lone surrogates replaced)
    key = (node.id, encoding)
    facts = _FACTS.get(key)
    if facts is None:
        facts = (hashlib.sha256(raw).hexdigest(), message_status(dict(node.message), text), count_text(text, encoding))
        _FACTS.put(key, facts)
    return (text, *facts)


_MESSAGE_TOKENS = BoundedCache(262144)  # (node id, encoding) -> tokens of the node's message
# The token counts of a path by (node id of its last message, encoding): a node id names its whole
# prefix, so the next request of the conversation counts (or looks up) only its new messages. Lists of
# small ints, one per request: a few hundred conversations' worth.
_PATH_TOKENS = BoundedCache(256)


def path_tokens(path: Sequence[PathNode], encoding: str = DEFAULT_ENCODING) -> list[int]:
    """`message_tokens` of each message of the path, remembered by node id: a node id names its
    message, and an agent re-sends the same messages every turn, so each is counted once per process
    (without hashing its text again, as a cache keyed by text would). The counts of the longest prefix
    an earlier request of the conversation ended on (within its last few messages) are taken whole."""
    out: list[int] = []
    start = 0
    for position in last_positions(len(path)):
        found = _PATH_TOKENS.get((path[position].id, encoding))
        if found is not None:
            out, start = list(found), position + 1
            break
    for node in path[start:]:
        key = (node.id, encoding)
        tokens = _MESSAGE_TOKENS.get(key)
        if tokens is None:
            tokens = message_tokens(node.message, encoding)
            _MESSAGE_TOKENS.put(key, tokens)
        out.append(tokens)
    if path and start < len(path):
        _PATH_TOKENS.put((path[-1].id, encoding), tuple(out))
    return out


# A path's records as its request left them, by (node id of the path's last message, encoding): the
# next request of the conversation extends its previous one and builds views for its new messages
# alone. A node id names its whole prefix (content and parents), so an entry is a function of its key
# except for `observed_at` and `owner_participant`, which come from the store and are checked against
# each request's. Entries of one conversation share their views; the views hold the results' texts, so
# few conversations are kept: at most 128 entries, holding at most VIEWS_TEXT_BUDGET characters of
# results (counted per entry, so shared views count more than once). Counted by entries alone, a burst
# of conversations with multi-MB transcripts kept hundreds of MB after it (bench/large_bodies.py).
_PREFIXES = views_cache(lambda prefix: prefix.chars)


@dataclass(frozen=True)
class _Prefix:
    length: int
    artifacts: dict[int, ArtifactView]
    argument_refs: dict[tuple[int, str], str]
    calls: dict[str, tuple[int, Mapping]]  # the calls of the latest assistant message, by id
    chars: int  # `views_text(artifacts)`, counted view by view as they were made


def records_for_path(
    path: Sequence[PathNode],
    now: float,
    *,
    observed_at: Mapping[str, float] | None = None,
    owners: Mapping[str, str] | None = None,
    sibling_artifacts: int = 0,
    subagent_results: Mapping[str, str] | None = None,
    rehydrated: frozenset[str] = frozenset(),
    encoding: str = DEFAULT_ENCODING,
) -> Records:
    observed_at, owners = observed_at or {}, owners or {}
    prefix = _earlier_prefix(path, encoding)
    if prefix is not None:
        artifacts = dict(prefix.artifacts)
        argument_refs = dict(prefix.argument_refs)
        calls, chars = prefix.calls, prefix.chars
        for position, view in prefix.artifacts.items():
            seen, owner = observed_at.get(view.artifact_id, now), owners.get(view.artifact_id, "")
            if view.observed_at != seen or view.owner_participant != owner:
                artifacts[position] = replace(view, observed_at=seen, owner_participant=owner)
        start = prefix.length
    else:
        artifacts, argument_refs, calls, start, chars = {}, {}, {}, 0, 0
    for node in path[start:]:
        message = node.message
        role = message.get("role")
        if role == "assistant":
            calls = {}
            for call in message.get("tool_calls") or []:
                call_id = str(call.get("id"))
                calls[call_id] = (node.position, call)
                argument_refs[(node.position, call_id)] = arguments_artifact_id(node.id, call_id)
        elif role == "tool":
            text, sha256, status, tokens = _facts(node, encoding)
            artifact_id = artifact_id_for(node.id)
            _, call = calls.get(str(message.get("tool_call_id")), (None, {}))
            function = call.get("function") or {}
            artifacts[node.position] = view = ArtifactView(
                artifact_id=artifact_id,
                tool_name=function.get("name"),
                arguments=function.get("arguments"),
                status=status,
                content=text,
                sha256=sha256,
                tokens=tokens,
                observed_at=observed_at.get(artifact_id, now),
                owner_participant=owners.get(artifact_id, ""),
            )
            chars += view_text(view)
    if path and (prefix is None or prefix.length < len(path)):
        _PREFIXES.put((path[-1].id, encoding), _Prefix(len(path), artifacts, argument_refs, calls, chars))
    return Records(artifacts=dict(artifacts), argument_refs=dict(argument_refs), sibling_artifacts=sibling_artifacts,
                   subagent_results=dict(subagent_results or {}), rehydrated=rehydrated, views_chars=chars)


def _earlier_prefix(path: Sequence[PathNode], encoding: str) -> _Prefix | None:
    """The records of the longest prefix of `path` (ending within its last few messages) that an
    earlier request built."""
    for position in last_positions(len(path)):
        found = _PREFIXES.get((path[position].id, encoding))
        if found is not None:
            return found
    return None
