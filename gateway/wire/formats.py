"""Which wire format a path speaks, and errors rendered in it."""
from __future__ import annotations

from fastapi.responses import JSONResponse

from gateway.errors import GatewayError
from gateway.wire import WireFormat
from gateway.wire.anthropic_messages import ANTHROPIC_MESSAGES
from gateway.wire.gemini import GEMINI
from gateway.wire.openai_chat import OPENAI_CHAT


def format_for_path(path: str) -> WireFormat:
    """The format whose error shape a path answers in: Anthropic's under /v1/messages, Google's under
    /v1beta/ and for `/v1/models/{model}:{method}`, else OpenAI's."""
    if path.startswith(("/v1/messages", "/messages")):
        return ANTHROPIC_MESSAGES
    if path.startswith("/v1beta/") or (path.startswith("/v1/models/") and ":" in path):
        return GEMINI
    return OPENAI_CHAT


def error_response(path: str, error: GatewayError) -> JSONResponse:
    body = format_for_path(path).error_body(error)
    return JSONResponse(body, status_code=error.status_code, headers=error.headers)
