"""The fake's compaction endpoint: `POST /v1/responses/compact`, as OpenAI documents it.

It answers a `response.compaction` object: the input's user messages, then one `compaction` item whose
`encrypted_content` is opaque (`fake-compaction:<n>`). The fake keeps what each one compacted, and its
`/v1/responses` reads such an item in an input as those items again (`expand`), as a provider reads
its own encrypted summary: a responder sees the whole conversation, whatever was compacted. Another
`encrypted_content` (a gateway's, say) is left as it is. With `state.compact_endpoint` False the route
answers 404, as an OpenAI-compatible server without the endpoint does.
"""
from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from gateway.fake_upstream.state import FakeState

PREFIX = "fake-compaction:"


def expand(state: FakeState, items: list[Any]) -> list[Any]:
    """`items` with each of the fake's own compaction items replaced by what it compacted."""
    out: list[Any] = []
    for item in items:
        content = item.get("encrypted_content") if isinstance(item, dict) and item.get("type") == "compaction" else None
        compacted = state.compacted.get(content[len(PREFIX):]) if isinstance(content, str) \
            and content.startswith(PREFIX) else None
        if compacted is None:
            out.append(item)
            continue
        kept = {repr(i) for i in out}
        out.extend(i for i in compacted if repr(i) not in kept)  # its user messages stood beside it
    return out


def expanded(state: FakeState, body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request as its responder sees it: the fake's compaction items read (the body itself when
    it holds none)."""
    items = body.get("input")
    if not isinstance(items, list) or not any(isinstance(i, dict) and i.get("type") == "compaction" for i in items):
        return body
    return {**body, "input": expand(state, items)}


def add_compaction_routes(app: FastAPI, state: FakeState) -> None:
    @app.post("/v1/responses/compact")
    async def compact(request: Request) -> Any:
        body = await request.json()
        with state.lock:
            number = state.record(request, body, "/v1/responses/compact")
            if not state.compact_endpoint:
                return JSONResponse({"error": {"message": "Not found", "type": "invalid_request_error"}},
                                    status_code=404)
            raw = body.get("input")
            items = expand(state, [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str)
                           else list(raw or []))
            state.compacted[str(number)] = items
        users = [i for i in items if isinstance(i, dict) and i.get("role") == "user"]
        item = {"type": "compaction", "id": f"cmp_fake_{number}", "encrypted_content": f"{PREFIX}{number}"}
        tokens = max(1, len(str(items)) // 4)
        return {"id": f"resp_fake_{number}", "object": "response.compaction", "created_at": int(time.time()),
                "output": [*users, item],
                "usage": {"input_tokens": tokens, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 50,
                          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": tokens + 50}}
