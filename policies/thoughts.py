"""The prose an old assistant turn wrote beside its tool calls, cut to a note of its length.

An agent's turn that calls tools often says what it is about to do and why ("Let me look at the
test file to see how the expected output is built"). Once the round it opened is compacted, its
calls (their arguments, compacted or not) and the memories of their results say what was done;
the prose is replaced by `[earlier reasoning omitted: N chars]`, one note in the place of each
piece of plain text. Only plain text goes: every other block (thinking and its signature, a
Responses reasoning or call item, a Gemini part with a thought signature, a text block with
citations or a cache marker) stays byte-exact and in its place, and a turn without calls (an
answer to the user) is never touched here.

Plain text, as each format carries it in the neutral transcript: a string; a `{"type": "text",
"text": ...}` block (Chat's parts, Anthropic's blocks, Gemini's plain parts); a Responses
`message` item's `output_text` parts (policies/transcript.py `_answer_text` reads the same shapes).
"""
from __future__ import annotations

from typing import Any, Mapping

from policies.tokens import count_text

_PLAIN_BLOCK = frozenset({"type", "text"})
_OUTPUT_TEXT = frozenset({"type", "text", "annotations", "logprobs"})


def thought_note(chars: int) -> str:
    return f"[earlier reasoning omitted: {chars} chars]"


def _is_plain(block: Any) -> bool:
    return (isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str)
            and set(block) <= _PLAIN_BLOCK)


def _is_output_text(part: Any) -> bool:
    return (isinstance(part, Mapping) and part.get("type") == "output_text" and isinstance(part.get("text"), str)
            and set(part) <= _OUTPUT_TEXT)


def _is_message_item(block: Any) -> bool:
    """A Responses assistant `message` item made of output text alone (no refusal, nothing else)."""
    if not (isinstance(block, Mapping) and block.get("type") == "message" and block.get("role", "assistant") == "assistant"):
        return False
    parts = block.get("content")
    return isinstance(parts, list) and bool(parts) and all(_is_output_text(p) for p in parts)


def thought_text(content: Any) -> str:
    """The plain text of an assistant turn's content: what `compact_thought` would replace."""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for block in content if isinstance(content, list) else ():
        if _is_plain(block):
            texts.append(block["text"])
        elif _is_message_item(block):
            texts.extend(p["text"] for p in block["content"])
    return "".join(texts)


def compact_thought(content: Any, min_tokens: int, encoding: str) -> tuple[Any, int] | None:
    """`content` with its plain text replaced by notes of its length, and the characters omitted; None
    when its plain text (blank aside) has fewer than `min_tokens` tokens, or is shorter than the note."""
    text = thought_text(content)
    if not text.strip() or len(text) <= len(thought_note(len(text))) or count_text(text, encoding) < min_tokens:
        return None
    if isinstance(content, str):
        return thought_note(len(content)), len(content)
    out: list[Any] = []
    for block in content:
        if _is_plain(block):
            block = {"type": "text", "text": thought_note(len(block["text"]))}
        elif _is_message_item(block):
            chars = sum(len(p["text"]) for p in block["content"])
            block = {**block, "content": [{"type": "output_text", "text": thought_note(chars), "annotations": []}]}
        out.append(block)
    return out, len(text)
