"""The upstream exchange: one request to the provider, growing over the hidden rounds the gateway's
own tool adds, and the answer the client gets of it (JSON or a relayed stream).

`driver.py` runs the rounds for every format; each upstream API brings its
dialect (`openai_chat.py`, `anthropic_messages.py`, `openai_responses.py`, `gemini.py`,
under the protocol in `dialect.py`). The pipeline picks one by the API a wire
format forwards in (`WireFormat.upstream`).
"""
from __future__ import annotations

from gateway.exchange.anthropic_messages import MESSAGES
from gateway.exchange.dialect import Completion, Dialect
from gateway.exchange.driver import Exchange, FirstRound, Relay, complete
from gateway.exchange.gemini import GEMINI
from gateway.exchange.openai_chat import CHAT
from gateway.exchange.openai_responses import RESPONSES

DIALECTS: dict[str, Dialect] = {dialect.api: dialect for dialect in (CHAT, MESSAGES, RESPONSES, GEMINI)}

__all__ = ["DIALECTS", "Completion", "Dialect", "Exchange", "FirstRound", "Relay", "complete"]
