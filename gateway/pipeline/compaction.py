"""Codex's remote compaction on any provider behind the gateway (issue 32).

Codex (its built-in OpenAI provider) compacts its context remotely: version 0.169.0 sends a streamed
`POST /v1/responses` whose input ends in a `compaction_trigger` item and wants exactly one `compaction`
output item back (`encrypted_content`, opaque to it), which it then sends as input in place of the turns
it compacted; OpenAI documents the same item from `POST /v1/responses/compact`. Behind a proxy without
either, Codex's compaction fails and has no fallback.

Both come down the ordinary request path (gateway/pipeline/request_path.py: the transcript is captured,
its run opened, its projection assembled) with `NeutralRequest.compaction` set, and `Compactor` stands in
for the upstream client: on a deployment that speaks OpenAI's Responses API it posts the projection to
the provider's own `/responses/compact` (gateway/upstream/responses_compact.py) and answers with the
provider's compaction item; elsewhere (Anthropic, Gemini, a server without the endpoint) it answers with
a compaction item of the gateway's own, whose content is a signed reference to the captured transcript
(gateway/pipeline/compaction_refs.py), put back in its place when the item returns as input. Either way
the answer is the Responses API's (a response, streamed or whole; for `/responses/compact` a
`response.compaction` object), and the compaction is a row of `compactions` (storage/compactions.py).
"""
from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Mapping

from gateway.errors import GatewayError, UpstreamInvalidResponse
from gateway.pipeline.compaction_refs import reference
from gateway.services import Services
from gateway.threads import off_loop
from gateway.upstream.responses_compact import NoCompactEndpoint, post_compact
from gateway.upstream.seam import Api, UpstreamRequest, WrappedUpstream
from gateway.wire import NeutralRequest
from policies.assembly_types import Projection
from storage.compactions import CompactionRecord
from storage.record_types import RunStart

FORWARDING_PROVIDERS = frozenset({"openai"})  # deployments whose API is OpenAI's Responses, with /responses/compact
_NO_USAGE = {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 0}


class Compactor(WrappedUpstream):
    """The upstream client of one compaction request: forwards it to the provider's endpoint, or answers it."""

    def __init__(self, services: Services, run: RunStart, conversation_id: str | None, neutral: NeutralRequest,
                 provider: str, projection: Projection) -> None:
        super().__init__(services.upstream)
        self.services, self.run, self.conversation_id = services, run, conversation_id
        self.neutral, self.provider, self.projection = neutral, provider, projection
        self.endpoint = neutral.compaction or "responses"

    async def call(self, api: Api, request: UpstreamRequest) -> dict[str, Any]:
        if api != "responses":
            raise GatewayError(f"a compaction is answered in the Responses API, not {api}")
        output, usage, source, forwarded = await self._compacted(request)
        compaction_id = f"cmp_{uuid.uuid4().hex}"
        if source == "gateway":
            output = [{"type": "compaction", "id": compaction_id,
                       "encrypted_content": reference(self.services.sessions, self.run.tenant, compaction_id)}]
        await off_loop(self.services.store.record_compaction, self._record(compaction_id, source, forwarded, output))
        return self._response(output, usage)

    async def stream(self, api: Api, request: UpstreamRequest) -> AsyncIterator[dict[str, Any]]:
        response = await self.call(api, request)
        for event in response_events(response):
            yield event

    async def _compacted(self, request: UpstreamRequest) -> tuple[list[dict[str, Any]], dict[str, Any], str, int]:
        """(output items, usage, "provider" or "gateway", tokens forwarded); the gateway's items are made
        by the caller, once the compaction has its id."""
        if self.provider not in FORWARDING_PROVIDERS:
            return [], dict(_NO_USAGE), "gateway", 0
        body = {"input": request.body.get("input") or [], **_instructions(request.body)}
        try:
            answer = await post_compact(request.litellm_params, body, timeout=request.timeout_seconds,
                                        request_id=request.request_id)
        except NoCompactEndpoint:
            return [], dict(_NO_USAGE), "gateway", 0
        output = answer["output"]
        if self.endpoint == "responses":  # Codex's trigger: the compaction item alone
            output = [item for item in output if item.get("type") == "compaction"][-1:]
            if not output:
                raise UpstreamInvalidResponse("upstream: the compaction's answer holds no compaction item")
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else dict(_NO_USAGE)
        return output, usage, "provider", self.projection.tokens_forwarded

    def _response(self, output: list[dict[str, Any]], usage: Mapping[str, Any]) -> dict[str, Any]:
        base = {"id": f"resp_{self.run.request_id.removeprefix('req_')}", "created_at": int(time.time()),
                "model": self.neutral.model, "output": output, "usage": dict(usage)}
        if self.endpoint == "responses/compact":
            return {**base, "object": "response.compaction"}
        return {**base, "object": "response", "status": "completed", "error": None, "incomplete_details": None,
                "instructions": self.neutral.params.get("instructions"), "metadata": {},
                "parallel_tool_calls": bool(self.neutral.params.get("parallel_tool_calls", True)),
                "tool_choice": self.neutral.params.get("tool_choice", "auto"), "tools": []}

    def _record(self, compaction_id: str, source: str, forwarded: int,
                output: list[dict[str, Any]]) -> CompactionRecord:
        return CompactionRecord(
            id=compaction_id, tenant=self.run.tenant, request_id=self.run.request_id,
            conversation_id=self.conversation_id, source=source, endpoint=self.endpoint, model=self.neutral.model,
            input_items=len(self.neutral.messages), input_tokens=self.projection.tokens_original,
            forwarded_tokens=forwarded, output_items=len(output),
            output_bytes=len(json.dumps(output, ensure_ascii=False, separators=(",", ":")).encode()),
            created_at=datetime.fromtimestamp(self.services.clock(), timezone.utc))


def _instructions(body: Mapping[str, Any]) -> dict[str, Any]:
    instructions = body.get("instructions")
    return {"instructions": instructions} if isinstance(instructions, str) and instructions else {}


def response_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole response as the Responses API streams it (the relay numbers the events)."""
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events = [{"type": "response.created", "response": started}, {"type": "response.in_progress", "response": started}]
    for index, item in enumerate(response["output"]):
        events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return [*events, {"type": "response.completed", "response": response}]


def compactor_for(services: Services, run: RunStart, conversation_id: str | None, neutral: NeutralRequest,
                  provider: str, projection: Projection) -> Compactor | None:
    """The stand-in upstream of a compaction request; None for any other request."""
    if neutral.compaction is None:
        return None
    return Compactor(services, run, conversation_id, neutral, provider, projection)
