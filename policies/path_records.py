"""The assembler's records for a request path, built the same way online and offline.

The gateway passes what only the store knows (when each artifact was first
observed, by whom); `gateway replay` passes nothing and every artifact is
observed "now". Ids, statuses and token counts come from the path itself, so
both paths give the assembler identical inputs for identical transcripts.
"""
from __future__ import annotations

import hashlib
from typing import Mapping, Sequence

from policies.assembler import Records
from policies.memories import ArtifactView
from policies.tokens import DEFAULT_ENCODING, count_text
from policies.tool_status import tool_result_status
from policies.transcript import PathNode, arguments_artifact_id, artifact_id_for, tool_result_bytes


def records_for_path(
    path: Sequence[PathNode],
    now: float,
    *,
    observed_at: Mapping[str, float] | None = None,
    owners: Mapping[str, str] | None = None,
    sibling_artifacts: int = 0,
    subagent_results: Mapping[str, str] | None = None,
    encoding: str = DEFAULT_ENCODING,
) -> Records:
    artifacts: dict[int, ArtifactView] = {}
    argument_refs: dict[tuple[int, str], str] = {}
    calls: dict[str, tuple[int, Mapping]] = {}
    for node in path:
        message = node.message
        role = message.get("role")
        if role == "assistant":
            calls = {}
            for call in message.get("tool_calls") or []:
                call_id = str(call.get("id"))
                calls[call_id] = (node.position, call)
                argument_refs[(node.position, call_id)] = arguments_artifact_id(node.id, call_id)
        elif role == "tool":
            raw, _ = tool_result_bytes(message.get("content"))
            text = raw.decode("utf-8", "replace")
            artifact_id = artifact_id_for(node.id)
            _, call = calls.get(str(message.get("tool_call_id")), (None, {}))
            function = call.get("function") or {}
            artifacts[node.position] = ArtifactView(
                artifact_id=artifact_id,
                tool_name=function.get("name"),
                arguments=function.get("arguments"),
                status=tool_result_status(text),
                content=text,
                sha256=hashlib.sha256(raw).hexdigest(),
                tokens=count_text(text, encoding),
                observed_at=(observed_at or {}).get(artifact_id, now),
                owner_participant=(owners or {}).get(artifact_id, ""),
            )
    return Records(artifacts=artifacts, argument_refs=argument_refs, sibling_artifacts=sibling_artifacts,
                   subagent_results=dict(subagent_results or {}))
