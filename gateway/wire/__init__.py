"""Wire formats: one module per format, translation only.

Each format turns its request body into a `NeutralRequest` (the transcript as
OpenAI Chat Completions messages, which is what the assembler speaks, with
blocks that have no Chat equivalent carried as they came) and renders the
projection back into its own request shape; answers go back in its own shape
too, with its usage (the hidden rounds of the upstream exchange are read by the
format's dialect in gateway/exchange/). No module here touches storage;
`gateway/pipeline/request_path.py` does the rest, the same for every format.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from gateway.errors import GatewayError


@dataclass(frozen=True)
class NeutralRequest:
    """A model request in the pipeline's terms."""

    model: str
    messages: list[dict[str, Any]]  # the neutral transcript: OpenAI chat messages, as the client sent them
    stream: bool
    params: Mapping[str, Any] = field(default_factory=dict)  # every other field, forwarded as the client sent it
    wants_stream_usage: bool = False  # the client asked for the usage chunk at the end of a stream
    previous_response_id: str | None = None  # Responses: the stored response this request continues
    sse: bool = True  # a stream as server-sent events (Gemini's `alt=sse`); else its JSON-array stream
    # Digests of `messages`' exact JSON (gateway/wire/seen_messages.py), where parsing worked them out
    digests: list[bytes | None] | None = None
    # The provider-side context edits the client asks for (Anthropic's `context_management.edits`,
    # forwarded as sent): recorded on the run, and the projection leaves to the provider what it clears
    context_edits: list[dict[str, Any]] | None = None
    # A remote compaction the client asks for (gateway/pipeline/compaction.py): "responses" (a Responses
    # request ending in a `compaction_trigger` item, taken off), "responses/compact" (that endpoint); else None
    compaction: str | None = None

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        tools = self.params.get("tools")
        return tools if isinstance(tools, list) and tools else None



class WireFormat(Protocol):
    name: str  # recorded on the run: openai.chat, anthropic.messages, openai.responses
    upstream: str  # the upstream API its requests are forwarded in: "chat", "messages" or "responses"
    # What differs between formats, asked of the format (never of its class):
    # the rehydration tool can be added mid-conversation, where the first memory appears, instead of in
    # `tools` (gateway/pipeline/tool_additions.py; Anthropic's, to a native Anthropic deployment)
    adds_tools_midway: bool
    # the format marks cache breakpoints itself (Anthropic's cache_control), so the projection foresees
    # where the next request's bytes stay the same
    marks_cache: bool

    def parse(self, raw: bytes, max_messages: int | None = None) -> NeutralRequest:
        """The checked request; raises InvalidRequest naming the field at fault (too_many_messages when
        its transcript passes `max_messages` items, before they are checked)."""

    def upstream_body(self, request: NeutralRequest, messages: list[dict[str, Any]],
                      stable: Sequence[int] = (), addition: tuple[dict[str, Any], int] | None = None
                      ) -> dict[str, Any]:
        """The request to forward (every field but model and stream) with the projection as its transcript.

        `addition`: (tool, neutral index) where a format that `adds_tools_midway` declares the tool; the
        others are never given one.

        `stable`: neutral message indices after which the projection's bytes are stable, most needed
        first; a format with explicit cache markers (Anthropic's) places them there."""

    def rehydration_tool(self, name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        """The gateway's rehydration tool, declared the format's way."""

    def answer_message(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """An answer in this format (a whole body, as the client got it) as the assistant message of the
        neutral transcript its client sends back on the next request; None if it holds none."""

    def error_body(self, error: GatewayError) -> dict[str, Any]: ...

    def stream_error(self, error: GatewayError) -> bytes:
        """The event that ends a stream that failed after it began."""
