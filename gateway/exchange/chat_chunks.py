"""Streamed Chat answers: rebuilding the final message from chat.completion.chunk objects."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StreamAccumulator:
    """Folds chat.completion.chunk objects into one assistant message and usage."""

    id: str | None = None
    model: str | None = None
    created: int | None = None
    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    chunks: int = 0

    def add(self, chunk: dict[str, Any]) -> None:
        self.chunks += 1
        self.id = self.id or chunk.get("id")
        self.model = self.model or chunk.get("model")
        self.created = self.created or chunk.get("created")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(
                    int(call.get("index", 0)),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                function = call.get("function") or {}
                if function.get("name"):
                    slot["function"]["name"] += function["name"]
                if function.get("arguments"):
                    slot["function"]["arguments"] += function["arguments"]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def content_text(self) -> str:
        return "".join(self.content)

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.tool_calls:
            out["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return out

    def response(self) -> dict[str, Any]:
        """The equivalent non-streamed chat.completion, for the record."""
        return {
            "id": self.id,
            "object": "chat.completion",
            "model": self.model,
            "choices": [{"index": 0, "message": self.message(), "finish_reason": self.finish_reason}],
            "usage": self.usage,
        }
