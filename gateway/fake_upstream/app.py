"""The fake upstream's app: the four model APIs on one server, and its control routes.

`POST /v1/chat/completions`, `POST /v1/responses` (with `/v1/responses/compact`), `POST /v1/messages` (with
`/v1/messages/count_tokens`, `/v1/embeddings`, `/v1/completions`, `GET /v1/models`) and Gemini's
`POST /v1beta/models/{model}:generateContent` (with `streamGenerateContent`, `countTokens`),
streamed and not, each answering the next step of the shared state. Control:
`POST /_script` queues one step, `POST /_default` sets the step of every unscripted
answer, `GET /_requests` lists the requests received (bodies and headers),
`POST /_reset` forgets both.

`gateway fake-upstream` serves it (gateway/cli.py); the test suite starts it in a
thread (testkit/fake_upstream.py).
"""
from __future__ import annotations

from typing import Any

import uvicorn
from fastapi import FastAPI, Request

from gateway.fake_upstream.agent import AgentScript
from gateway.fake_upstream.chat import add_chat_routes
from gateway.fake_upstream.compaction import add_compaction_routes
from gateway.fake_upstream.gemini import add_gemini_routes
from gateway.fake_upstream.messages import add_messages_routes
from gateway.fake_upstream.reader import Reader
from gateway.fake_upstream.responses import add_responses_routes
from gateway.fake_upstream.state import FakeState, Step


def build_app(state: FakeState) -> FastAPI:
    app = FastAPI()

    @app.post("/_script")
    async def script(request: Request) -> dict[str, int]:
        body = await request.json()
        with state.lock:
            state.script.append(Step(**body))
        return {"queued": len(state.script)}

    @app.post("/_default")
    async def default(request: Request) -> dict[str, bool]:
        """The step every unscripted answer takes from now on (`{}`: the plain "ok" again)."""
        body = await request.json()
        Step(**body)  # checked now, not on the next answer
        with state.lock:
            state.default_step = body or None
        return {"ok": True}

    @app.post("/_reset")
    async def reset() -> dict[str, bool]:
        state.clear()
        return {"ok": True}

    @app.get("/_requests")
    async def requests_() -> list[dict[str, Any]]:
        return state.requests

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "fake"}]}

    add_chat_routes(app, state)
    add_messages_routes(app, state)
    add_responses_routes(app, state)
    add_compaction_routes(app, state)
    add_gemini_routes(app, state)
    return app


def serve(host: str, port: int, agent: AgentScript | Reader | None, delay: float = 0.0,
          keep_requests: int = 1000) -> None:
    """Serve until interrupted: with `agent` (a script, or the reader of gateway/fake_upstream/reader.py),
    unscripted answers follow it in every format; without, "ok"."""
    state = FakeState(default_delay=delay, keep_requests=keep_requests)
    if agent is not None:
        agent.drive(state)
    uvicorn.run(build_app(state), host=host, port=port, log_level="warning")
