"""Wire formats: one module per format, translation only.

Each format turns its request body into a `NeutralRequest` (the transcript as
OpenAI Chat Completions messages, which is what the assembler and the upstream
client speak) and turns the pipeline's answers back into its own shape: a JSON
body, a stream of server-sent events, an error. No module here touches
storage; `gateway/pipeline.py` does the rest, the same for every format.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from gateway.errors import GatewayError


@dataclass(frozen=True)
class NeutralRequest:
    """A model request in the pipeline's terms."""

    model: str
    messages: list[dict[str, Any]]  # the neutral transcript: OpenAI chat messages, as the client sent them
    stream: bool
    params: Mapping[str, Any] = field(default_factory=dict)  # every other field, forwarded as the client sent it
    wants_stream_usage: bool = False  # the client asked for the usage chunk at the end of a stream

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        tools = self.params.get("tools")
        return tools if isinstance(tools, list) and tools else None

    def upstream_body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The fields to forward, with `messages` replaced by the projection."""
        out = {k: v for k, v in self.params.items() if k != "stream_options" or self.stream}
        out["messages"] = messages
        return out


class StreamRenderer(Protocol):
    """Turns the pipeline's chat.completion.chunk dicts into the format's SSE bytes."""

    def chunk(self, chunk: dict[str, Any]) -> bytes: ...

    def usage(self, chunk: dict[str, Any]) -> bytes:
        """The final usage chunk (sent only if the format or the client wants it)."""

    def done(self) -> bytes: ...

    def error(self, error: GatewayError) -> bytes: ...


class WireFormat(Protocol):
    name: str  # recorded on the run: openai.chat, anthropic.messages, openai.responses

    def parse(self, raw: bytes) -> NeutralRequest:
        """The checked request; raises InvalidRequest naming the field at fault."""

    def response(self, completion: dict[str, Any], request: NeutralRequest) -> dict[str, Any]:
        """The JSON answer for a chat.completion."""

    def stream_renderer(self, request: NeutralRequest) -> StreamRenderer: ...

    def error_body(self, error: GatewayError) -> dict[str, Any]: ...
