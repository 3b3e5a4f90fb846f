"""Transcript identity: canonical messages and hash-chained message node ids.

A message node's id is a hash of (tenant, parent node id, canonical message),
so the same conversation re-sent turn after turn maps onto the same nodes, a
conversation is a tree, and a request is a path in it.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

# Fields that carry meaning for the model. Anything else a client adds
# (`refusal`, `annotations`, SDK-specific extras) does not change identity,
# so an agent that re-serialises its own history slightly differently does
# not fork the conversation.
_IDENTITY_FIELDS = ("role", "name", "content", "tool_calls", "tool_call_id", "function_call", "is_error")

NODE_ID_BYTES = 16  # 32 hex characters


def _canonical_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "id": call.get("id"),
        "type": call.get("type") or "function",
        "function": {"name": function.get("name"), "arguments": function.get("arguments")},
    }


def canonical_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The identity-bearing part of a message, with empty values dropped."""
    out: dict[str, Any] = {}
    for key in _IDENTITY_FIELDS:
        value = message.get(key)
        if value is None or (value == "" and key == "content" and message.get("role") == "assistant"):
            continue
        if key == "tool_calls":
            if not value:
                continue
            value = [_canonical_tool_call(c) for c in value]
        out[key] = value
    return out


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no spaces, unicode kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


Canonical = Callable[[Any], str]  # canonical_json, or a faster function giving the same text


def node_id(tenant: str, parent_id: str | None, message: Mapping[str, Any],
            canonical: Canonical = canonical_json) -> str:
    digest = hashlib.blake2b(digest_size=NODE_ID_BYTES)
    for part in (tenant, parent_id or "", canonical(canonical_message(message))):
        encoded = part.encode("utf-8", "surrogatepass")
        digest.update(len(encoded).to_bytes(8, "big"))
        digest.update(encoded)
    return digest.hexdigest()


class PathNode(NamedTuple):
    """One message of a request, placed in the tenant's message tree. (A named tuple: a 1,000-message
    request places 1,000 of them, and a frozen dataclass costs half as much again to make.)"""

    id: str
    parent_id: str | None
    position: int
    message: Mapping[str, Any]


NodeIdOf = Callable[[str, "str | None", Mapping[str, Any]], str]  # (tenant, parent, message) -> node id


def message_path(tenant: str, messages: Iterable[Mapping[str, Any]],
                 canonical: Canonical = canonical_json, *, ids: NodeIdOf | None = None) -> list[PathNode]:
    """The request's messages placed in the tenant's tree (`ids`: a faster `node_id` with `canonical`)."""
    path: list[PathNode] = []
    parent: str | None = None
    for position, message in enumerate(messages):
        nid = ids(tenant, parent, message) if ids is not None else node_id(tenant, parent, message, canonical)
        path.append(PathNode(id=nid, parent_id=parent, position=position, message=message))
        parent = nid
    return path


def label_conversation_id(tenant: str, label: str) -> str:
    """The conversation a session label names: `conv_` and a hash of tenant and label, so labels of any
    length fit and two tenants' labels never meet."""
    digest = hashlib.blake2b(f"{tenant}\x00{label}".encode("utf-8", "surrogatepass"), digest_size=NODE_ID_BYTES)
    return f"conv_{digest.hexdigest()}"


_CONTEXT_ROLES = ("system", "developer")


def opening_answer(path: Sequence[PathNode]) -> PathNode | None:
    """The model's first answer on the path: the first assistant message after the first message that is
    no system prompt (the opening). An assistant message that ends the path is not one: the request
    asks the model to continue it (a prefill), so it was not the model's answer."""
    opened = False
    for index in range(len(path) - 1):  # no copy of a long path
        node = path[index]
        role = node.message.get("role")
        if opened and role == "assistant":
            return node
        opened = opened or role not in _CONTEXT_ROLES
    return None


_USER_TEXT_PARTS = ("text", "input_text")
# A part that is one tagged block and nothing else (`<system-reminder>...</system-reminder>`,
# `<environment_context>...`): context an agent adds, not what its user said.
_CONTEXT_BLOCK = re.compile(r"\s*<([A-Za-z][\w:-]*)(\s[^>]*)?>.*</\1>\s*", re.DOTALL)


def _text_parts(message: Mapping[str, Any]) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") in _USER_TEXT_PARTS]


def _own_words(parts: list[str]) -> list[str]:
    return [p for p in parts if p.strip() and not _CONTEXT_BLOCK.fullmatch(p)]


def user_words(message: Mapping[str, Any]) -> str:
    """What a user turn's own text parts say, without the tagged context blocks an agent adds."""
    return " ".join(_own_words(_text_parts(message)))


def user_text(message: Mapping[str, Any]) -> str:
    """What a user message says, whitespace folded: its text parts, without the blocks of tagged context
    an agent adds to it, unless that is all it holds."""
    parts = _text_parts(message)
    return " ".join(" ".join(_own_words(parts) or [p for p in parts if p.strip()]).split())


def first_user_node(path: Sequence[PathNode]) -> PathNode | None:
    """The user message an unlabelled conversation is named by: the first that says something of its own
    (Codex sends its environment as a user message of one tagged block first), else the first."""
    first = None
    for node in path:
        if node.message.get("role") == "user":
            if _own_words(_text_parts(node.message)):
                return node
            first = first or node
    return first


_TEXT_PARTS = ("text", "output_text")


def _answer_text(content: Any) -> str:
    """The text of an answer's content as every format carries it: a string, text parts (Chat, Anthropic
    blocks) or Responses message items holding output text parts."""
    if isinstance(content, str):
        return content
    texts = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        inner = part.get("content") if part.get("type") == "message" else [part]
        for piece in inner if isinstance(inner, list) else ():
            if isinstance(piece, dict) and piece.get("type") in _TEXT_PARTS and isinstance(piece.get("text"), str):
                texts.append(piece["text"])
    return "".join(texts)


def _arguments_value(arguments: Any) -> Any:
    """A call's arguments as the value they spell (clients that parse them write them back with their own
    spacing), or as they are when they spell none."""
    if isinstance(arguments, str):
        try:
            return canonical_json(json.loads(arguments))
        except (ValueError, RecursionError):  # no JSON, or nested past what is worth reading
            return arguments
    return arguments


def answer_fingerprint(message: Mapping[str, Any]) -> str:
    """What identifies a model's answer however its client sends it back: its text (whitespace at its
    ends aside) and its calls (id, name, the arguments' value). What clients drop or rewrite when they
    replay an answer (item ids, statuses, annotations, citations, thinking and reasoning blocks, the
    spacing of arguments) is left out."""
    calls = []
    for call in message.get("tool_calls") or []:
        if isinstance(call, Mapping):
            function = call.get("function") or {}
            calls.append([call.get("id"), function.get("name"), _arguments_value(function.get("arguments"))])
    return canonical_json({"text": _answer_text(message.get("content")).strip(), "calls": calls})


def opening_conversation_id(tenant: str, parent_id: str | None, answer: Mapping[str, Any]) -> str:
    """The conversation opened by the model's answer `answer` to the transcript ending at node `parent_id`."""
    digest = hashlib.blake2b(digest_size=NODE_ID_BYTES)
    for part in ("opening", tenant, parent_id or "", answer_fingerprint(answer)):
        encoded = part.encode("utf-8", "surrogatepass")
        digest.update(len(encoded).to_bytes(8, "big"))
        digest.update(encoded)
    return digest.hexdigest()


def conversation_id_for(tenant: str, label: str | None, path: Sequence[PathNode], request_id: str) -> str:
    """The conversation a request belongs to: the unit users see, count and delete.

    A session label names it (`label_conversation_id`). Without one, its first exchange does: the
    transcript up to the model's first answer, with that answer (`opening_conversation_id`). A client
    that sends its transcript again with the model's answers in it stays in its conversation; two
    clients that open alike (same system prompt, same first message) part at the model's answers,
    which differ (calls carry ids of their own). A request before any answer (`request_id`) is a
    conversation of its own until its answer is known: the store then moves it into the conversation
    that answer opens (storage/conversations.py), the one its client's next request lands in.
    """
    if label:
        return label_conversation_id(tenant, label)
    answer = opening_answer(path)
    if answer is None:
        return request_id
    return opening_conversation_id(tenant, answer.parent_id, answer.message)


def artifact_id_for(node: str) -> str:
    """A tool message node has exactly one artifact; its id derives from the node's.

    80 bits of the node id: short, since memories repeat it to the model, and
    still far from colliding within one deployment.
    """
    return f"art_{node[:20]}"


SHORT_REF_HEX = 10  # 40 bits: unique within any one conversation, and almost surely within a tenant
_REFERENCE = re.compile(r"^(art|args)_([0-9a-f]{%d,64})$" % SHORT_REF_HEX)


def short_ref(artifact_id: str) -> str:
    """What memories call an artifact: its kind and the first `SHORT_REF_HEX` hex digits of its id. The
    full id stays in the records; rehydration and the records API resolve either (`refers_to`)."""
    kind, _, digits = artifact_id.partition("_")
    return f"{kind}_{digits[:SHORT_REF_HEX]}" if digits else artifact_id


def is_reference(text: str) -> bool:
    """Whether `text` can name an artifact: a full id, or a short reference of at least SHORT_REF_HEX digits."""
    return _REFERENCE.match(text) is not None


def refers_to(reference: str, artifact_id: str) -> bool:
    """Whether `reference` (a full id or a short one) names `artifact_id`."""
    return is_reference(reference) and artifact_id.startswith(reference) and (
        len(reference) == len(artifact_id) or artifact_id[len(reference)] != "_")


def tool_call_pk(assistant_node_id: str, call_id: str) -> str:
    """A ToolCall's id: a call id is unique only within its assistant message."""
    return hashlib.blake2b(f"{assistant_node_id}/{call_id}".encode(), digest_size=16).hexdigest()


def arguments_artifact_id(assistant_node_id: str, call_id: str) -> str:
    """The artifact id under which a call's raw arguments are served."""
    return f"args_{tool_call_pk(assistant_node_id, call_id)}"


def tool_result_bytes(content: Any) -> tuple[bytes, str]:
    """The raw bytes of a tool message's content and their media type.

    A string is kept exactly (UTF-8). Structured content (a list of parts) is
    kept as canonical JSON; it is what the client sent, minus whitespace.
    """
    if content is None:
        return b"", "text/plain; charset=utf-8"
    if isinstance(content, str):
        return content.encode("utf-8", "surrogatepass"), "text/plain; charset=utf-8"
    return canonical_json(content).encode("utf-8", "surrogatepass"), "application/json"
