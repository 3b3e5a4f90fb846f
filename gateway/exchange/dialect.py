"""What a wire format brings to the exchange: its dialect (gateway/exchange/driver.py runs the rounds).

A dialect reads the format's answers (JSON, and each stream round once read
whole, in the same shape) and says which calls in it are the gateway's own,
how a hidden round and its answers are appended to the upstream request, how
usage adds up, what the client gets in the end (never an empty turn the model did
not write: an answer that held only calls to the gateway's tool, past the bound,
gets the gateway's text), and how the gateway's tool leaves a request (the last one
of an exchange that reached the bound). For streams it keeps the
client's side of the stream across rounds (`StreamView`): which events pass at
once, which are held until the round ends (tool calls, since a round that calls
the gateway's tool is dropped whole), how the rounds' parts are renumbered as
one answer, and the frames that end the stream.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol

from gateway.errors import GatewayError
from gateway.pipeline.rehydration import Rehydrator
from gateway.upstream.seam import Api, UpstreamRequest
from gateway.wire import NeutralRequest

Answer = dict[str, Any]  # one upstream answer in the dialect's format (a stream round's, rebuilt), usage included


@dataclass(frozen=True)
class Completion:
    """A finished answer: the body the client gets, and what the run records of it."""

    body: dict[str, Any]  # in the client's format
    usage: dict[str, Any] | None  # Chat-shaped: prompt/completion/total tokens, cached and cache-write tokens
    finish_reason: str | None
    # The provider's own context edits the answer reports (Anthropic's `context_management.applied_edits`,
    # of the round that produced it); None when it reports none
    applied_edits: list[dict[str, Any]] | None = None


class GatewayTool(Protocol):
    """The gateway's own tool, as a dialect looks for it (gateway/pipeline/rehydration.py's `Rehydrator`)."""

    @property
    def name(self) -> str: ...

    def is_call(self, call: Mapping[str, Any]) -> bool: ...


class StreamRound(Protocol):
    """One upstream round of a stream, as the client's stream sees it."""

    ended: bool  # its terminal event was read: nothing after it is
    answered: bool  # the upstream answered in full, so a hidden round may follow (set once finished)

    def read(self, event: dict[str, Any]) -> Iterable[bytes]:
        """The frames that go to the client now; what is held waits for the round's end."""

    def finish(self) -> Answer:
        """The round as one answer, the parts shown so far counted as the client's; raises
        UpstreamInvalidResponse when the stream stopped before its terminal event."""


class StreamView(Protocol):
    """The client's side of one relayed stream, across its rounds."""

    # the stream's content type, when not server-sent events (Gemini's JSON array): `Relay.media_type`
    media_type: str

    def round(self, first: bool) -> StreamRound: ...

    def end(self, last: StreamRound, calls: list[dict[str, Any]], usage: dict[str, Any] | None) -> Iterable[bytes]:
        """The frames after the last round: its held parts but the gateway's `calls` (and, when that leaves
        the client nothing at all, the exchange's `unanswered` text), then the closing ones with the summed
        `usage` (all but the terminal frame)."""

    @property
    def completion(self) -> Completion: ...

    def terminal(self) -> bytes: ...

    def error(self, error: GatewayError) -> bytes:
        """The frame that ends a failed stream, in the stream's own terms."""


class ExchangeState(Protocol):
    """What a dialect reads of the exchange it answers for (gateway/exchange/driver.py's `Exchange`, which
    imports this module): the gateway's tool when it was offered, the client's request, the upstream one."""

    rehydrator: Rehydrator | None
    client: NeutralRequest
    request: UpstreamRequest

    def unanswered(self) -> str:
        """The client's text for an answer that held nothing but calls to the gateway's tool (recorded)."""


class Dialect(Protocol):
    """One upstream API's answers, as the exchange reads and rewrites them."""

    api: Api  # the upstream API it reads: "chat", "messages", "responses", "generate_content"
    field: str  # the request field hidden rounds are appended to
    usage_field: str = "usage"  # the answer's field that holds its usage (Gemini's: usageMetadata)

    def add_usage(self, total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
        """Usage summed over rounds (each answer's is its `usage` field), in the dialect's shape."""

    def gateway_calls(self, answer: Answer, tool: GatewayTool) -> list[dict[str, Any]]:
        """The answer's calls to the gateway's tool."""

    def as_tool_call(self, call: dict[str, Any]) -> Mapping[str, Any]:
        """A gateway call as the rehydrator reads it (a Chat tool call or an Anthropic tool_use block)."""
        return call

    def without_tool(self, body: dict[str, Any], name: str) -> dict[str, Any]:
        """The request `body` without the tool `name` (declared in `tools`, or added mid-conversation)."""

    def hidden_round(self, answer: Answer, calls: list[dict[str, Any]], answers: list[str]) -> list[dict[str, Any]]:
        """What a hidden round appends to the request: the answer (its gateway calls only) and theirs."""

    def completion(self, answer: Answer, calls: list[dict[str, Any]], usage: dict[str, Any] | None,
                   exchange: ExchangeState) -> Completion:
        """The client's answer: the last one, without the gateway's `calls` (the exchange's `unanswered`
        text when nothing else is left), with the summed usage."""

    def stream(self, exchange: ExchangeState) -> StreamView: ...
