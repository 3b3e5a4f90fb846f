"""The rehydration tool: the model asks for artifacts' exact bytes, the gateway answers.

The tool is added to a request when its projection holds compacted artifacts
and the client sent `tools`. Calls to it are answered here, never by the
client: the answer is checked against the tenant, the request's lineage, the
provider's privacy rules, participant visibility and subagent boundaries, and
bounded in bytes and tokens. Every answer, given or refused, is a decision in
the request's assembly record.

One call asks for one artifact (`{"artifact_id", "lines"}`: the answer is its
bytes) or several (`{"artifacts": [{"artifact_id", "lines"}, ...]}`, at most
`MAX_ARTIFACTS`: each given exactly between fence lines, the policy's bounds
holding for the whole answer, each refusal said with its reason). A request
allows `rehydration.max_rounds` hidden rounds (gateway/exchange/driver.py): the
round that reaches the bound tells the model so (`limit_notice`), and the
request after it goes without the tool, so the model answers or calls the
client's tools; if it calls the gateway's anyway and says nothing else, the
client gets `unanswered`'s text, never an empty turn. Each is recorded too
(action `rehydration_limit`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

from policies.assembly_types import Records
from policies.memories import ArtifactView
from policies.policy import Policy
from policies.transcript import short_ref
from policies.tokens import count_text
from policies.visibility import access
from storage.blobs import BlobCorrupted
from storage.encryption import EnvelopeError, UnknownKey
from storage.record_types import ArtifactCorrupted
from storage.records import RecordStore

_log = logging.getLogger("gateway.rehydration")
_ARTIFACT_ID = re.compile(r"^(?:art|args)_[0-9a-f]{1,64}$")
MAX_ARTIFACTS = 8  # artifacts one call may ask for
# Short: the declaration goes with every request of a conversation (bench/format_replay.py's cost against
# the client's own replay counts it; the items' fields are named in the description, not in a schema).
DESCRIPTION = (f"Exact content of artifact:<id>; lines: an optional range such as 120-160. Several at once: "
               f"artifacts, up to {MAX_ARTIFACTS} of {{artifact_id, lines}}.")
_ONE = {"artifact_id": {"type": "string"}, "lines": {"type": "string"}}
PARAMETERS = {"type": "object", "properties": {**_ONE, "artifacts": {"type": "array", "items": {"type": "object"}}}}
_RANGE = re.compile(r"^\s*(\d+)\s*(?:(-)\s*(\d+)?)?\s*$")
_USAGE = 'pass {"artifact_id": "<id after artifact:>"} or {"artifacts": [{"artifact_id": "...", "lines": "1-40"}]}'


def _line_range(arguments: Mapping[str, Any]) -> tuple[int, int | None] | None:
    """(first, last) 1-based lines asked for ("120-160", "120-", "120"), None for the whole;
    ValueError when they make no sense."""
    asked = arguments.get("lines")
    if asked is None or asked == "":
        return None
    match = _RANGE.match(str(asked))
    if not match:
        raise ValueError('lines is a range of line numbers such as "120-160"')
    first = int(match.group(1))
    last = int(match.group(3)) if match.group(3) else (None if match.group(2) else first)
    if first < 1 or last is not None and last < first:
        raise ValueError("lines counts from 1, and a range ends after it starts")
    return first, last


def _arguments(call: Mapping[str, Any]) -> dict[str, Any] | None:
    """A call's arguments (a Chat tool call's JSON, an Anthropic tool_use block's input); None if unreadable."""
    try:
        if "function" in call:
            arguments = json.loads((call.get("function") or {}).get("arguments") or "{}")
        else:  # an Anthropic tool_use block
            arguments = call.get("input")
    except (ValueError, TypeError, AttributeError):
        return None
    return arguments if isinstance(arguments, dict) else None


def _asked_id(value: Any) -> str:
    return str(value).strip().removeprefix("artifact:")


def _fence_tag(text: str) -> str:
    """A tag whose closing line `>>>tag` does not occur in `text`: the bytes between stay exact."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    for size in range(6, len(digest) + 1, 2):
        if f">>>{digest[:size]}" not in text:
            return digest[:size]
    number = 0
    while f">>>{digest}{number}" in text:
        number += 1
    return f"{digest}{number}"


@dataclass(frozen=True)
class _Given:
    """One artifact given: its bytes (or a bounded excerpt, marked) and the lines they are."""

    artifact_id: str
    body: str
    lines: str | None  # "lines 120-160 of 400", when a range was asked


@dataclass
class Rehydrator:
    """Answers `gateway_rehydrate` calls for one request."""

    policy: Policy
    records: Records
    store: RecordStore
    tenant: str
    participant: str
    provider: str
    rehydrations: list[dict[str, Any]]  # the request's record's (AssemblyRecord.rehydrations): appended to
    rounds: int = 0

    # What the lookups below read is made on the first call to the tool, not per request: most requests
    # never call it, and on a long path these maps cost as much as the projection's own work.
    @cached_property
    def _views(self) -> dict[str, ArtifactView]:
        return {v.artifact_id: v for v in self.records.artifacts.values()}

    @cached_property
    def _lineage(self) -> set[str]:
        return self.records.lineage()

    @cached_property
    def _by_ref(self) -> dict[str, str]:
        """Memories name artifacts by short references (policies.transcript.short_ref): this path's resolve here."""
        return {short_ref(artifact_id): artifact_id for artifact_id in self._lineage}

    def full_id(self, asked: str) -> str:
        """The artifact id a model's reference names on this path (itself when it names none here)."""
        return asked if asked in self._lineage else self._by_ref.get(asked, asked)

    @property
    def name(self) -> str:
        return self.policy.rehydration.tool_name

    def is_call(self, call: Mapping[str, Any]) -> bool:
        """A Chat tool call, or an Anthropic tool_use block, addressed to the gateway's tool."""
        name = (call.get("function") or {}).get("name") if "function" in call else call.get("name")
        return name == self.name

    def _refuse(self, artifact_id: str | None, reason: str, text: str) -> str:
        # The record keeps the id only when it is one: what else the model wrote there is its own text,
        # and assembly records, stored in the clear, hold no conversation content.
        named = artifact_id if artifact_id is not None and _ARTIFACT_ID.match(artifact_id) else None
        self.rehydrations.append({"index": None, "role": "tool", "action": "rehydration_refused", "reason": reason,
                                  "artifact_id": named, "round": self.rounds})
        return f"[{self.name} refused: {text}]"

    def _note_limit(self, reason: str, **more: Any) -> None:
        self.rehydrations.append({"index": None, "role": "tool", "action": "rehydration_limit", "reason": reason,
                                  "artifact_id": None, "round": self.rounds,
                                  "max_rounds": self.policy.rehydration.max_rounds, **more})

    def limit_notice(self) -> str:
        """Said after the answers of the round that reaches the policy's bound (recorded: `max_rounds`)."""
        self._note_limit("max_rounds")
        return (f"[{self.name}: that was the last round of rehydration this request allows "
                f"({self.policy.rehydration.max_rounds}); the tool is not offered on your next turn. Answer with "
                "what you have now, or call your own tools (for instance to read again what you still need).]")

    def past_limit(self, calls: int) -> None:
        """The model called the tool after it was withdrawn: the calls go unanswered (recorded)."""
        self._note_limit("called_past_limit", calls=calls)

    def unanswered(self, limit: bool = True) -> str:
        """The client's text when the model's last answer held nothing but calls to the gateway's tool: past
        the bound (`limit`), or in a round cut short (recorded: `empty_answer`)."""
        self._note_limit("empty_answer")
        if not limit:
            return ("[The model's answer ended while it asked the gateway for stored tool results, with nothing "
                    "else said. Ask again to continue.]")
        return (f"[The gateway's rehydration limit was reached ({self.policy.rehydration.max_rounds} rounds in "
                "one request) and the model gave no other answer. Ask again to continue.]")

    def answer(self, call: Mapping[str, Any]) -> str:
        """The tool message content for one call (runs in a worker thread: it reads the store)."""
        arguments = _arguments(call)
        if arguments is None:
            return self._refuse(None, "invalid_arguments", _USAGE)
        if "artifacts" in arguments:
            return self._several(arguments)
        if "artifact_id" not in arguments:
            return self._refuse(None, "invalid_arguments", _USAGE)
        limits = self.policy.rehydration
        artifact_id = self.full_id(_asked_id(arguments["artifact_id"]))
        given = self._give(artifact_id, arguments, limits.max_bytes, limits.max_tokens)
        if isinstance(given, str):
            return given  # refused
        if given.lines is None:
            return given.body
        return f"[{self.name}: artifact:{given.artifact_id} {given.lines}]\n{given.body}"

    def _several(self, arguments: Mapping[str, Any]) -> str:
        """The answer to a call asking for several artifacts: each given between fence lines or refused,
        the policy's bounds holding for the whole answer."""
        items = arguments["artifacts"]
        if not isinstance(items, list) or not items:
            return self._refuse(None, "invalid_arguments", "artifacts is a list of {artifact_id, lines}")
        if arguments.get("artifact_id") is not None:  # both forms in one call: the single one first
            items = [{"artifact_id": arguments["artifact_id"], "lines": arguments.get("lines")}, *items]
        limits = self.policy.rehydration
        room = [limits.max_bytes, limits.max_tokens]
        parts: list[str] = []
        done: set[tuple[str, str]] = set()
        given = 0
        for number, item in enumerate(items):
            asked = item if isinstance(item, dict) else {"artifact_id": item}
            if not isinstance(asked.get("artifact_id"), str):
                parts.append(self._refuse(None, "invalid_arguments", f"artifacts[{number}] names no artifact_id"))
                continue
            artifact_id = self.full_id(_asked_id(asked["artifact_id"]))
            key = (artifact_id, str(asked.get("lines") or ""))
            if number >= MAX_ARTIFACTS:
                parts.append(self._refuse(artifact_id, "too_many", f"artifact:{artifact_id}: one call gives at most "
                                          f"{MAX_ARTIFACTS} artifacts; ask for it in another call"))
            elif key in done:
                parts.append(self._refuse(artifact_id, "duplicate", f"artifact:{artifact_id} is asked for twice"))
            elif min(room) <= 0:
                parts.append(self._refuse(artifact_id, "answer_bound", f"artifact:{artifact_id}: this answer "
                                          f"reached the policy's bound ({limits.max_bytes} bytes, {limits.max_tokens} "
                                          "tokens); ask for it in another call, or for fewer lines"))
            else:
                done.add(key)
                piece = self._give(artifact_id, asked, room[0], room[1])
                if isinstance(piece, str):
                    parts.append(piece)
                    continue
                given += 1
                room = [room[0] - len(piece.body.encode("utf-8", "surrogatepass")), room[1] - count_text(piece.body)]
                tag = _fence_tag(piece.body)
                label = f" {piece.lines}" if piece.lines else ""
                parts.append(f"<<<{tag} artifact:{piece.artifact_id}{label}\n{piece.body}\n>>>{tag}")
        head = (f"[{self.name}: {len(items)} asked, {given} given, {len(items) - given} refused; each artifact "
                "given is exact between its line <<<TAG artifact:<id> and its line >>>TAG]")
        return "\n".join([head, *parts])

    def _give(self, artifact_id: str, asked: Mapping[str, Any], max_bytes: int, max_tokens: int) -> _Given | str:
        """One artifact's bytes within `max_bytes` and `max_tokens` (the lines `asked` names, if it does), or
        the refusal's text; the decision is recorded either way."""
        try:
            lines = _line_range(asked)
        except ValueError as problem:
            return self._refuse(artifact_id, "invalid_arguments", str(problem))
        if artifact_id not in self._lineage:
            # Another branch's artifact exists for this tenant but is not this conversation's;
            # another tenant's (or a made-up id) is indistinguishable from one that does not exist.
            if self._exists(artifact_id):
                return self._refuse(artifact_id, "other_branch", f"artifact:{artifact_id} belongs to another branch")
            return self._refuse(artifact_id, "not_found", f"no artifact:{artifact_id} in this conversation")
        view = self._views.get(artifact_id)
        refusal = self._policy_refusal(view) if view is not None else None
        if refusal:
            return refusal
        raw = self._read(artifact_id, is_call=view is None)
        if isinstance(raw, str):
            return raw  # refused
        # Redacted as its memory was: a secret kept from the model there is not handed over here.
        # Line breaks survive redaction, so a range names the lines the memory numbered.
        raw, redacted = self.policy.redaction.redactor.redact_bytes(raw)
        if lines is None:
            given: _Given | str = _Given(artifact_id, self._bounded(artifact_id, raw, max_bytes, max_tokens), None)
        else:
            given = self._lines(artifact_id, raw, *lines, max_bytes=max_bytes, max_tokens=max_tokens)
        if redacted and self.rehydrations[-1]["action"] == "rehydrated":
            self.rehydrations[-1]["redacted"] = dict(redacted)
        if lines is None and view is not None and self.rehydrations[-1].get("reason") == "model_request":
            self._remember_given(artifact_id)
        return given

    def _remember_given(self, artifact_id: str) -> None:
        """Note in the store that the model had this result back whole, so the conversation's later requests
        forward it whole (policies/assembler.py `_rehydrate_named`). The answer does not wait on it failing."""
        try:
            self.store.mark_rehydrated(self.tenant, artifact_id)
        except Exception:  # noqa: BLE001 - a lost note costs a rehydration later, never this answer
            _log.warning("could not note artifact %s as rehydrated", artifact_id, exc_info=True)

    def _exists(self, artifact_id: str) -> bool:
        """Whether the tenant holds this artifact or call's arguments, readable now or not."""
        if _ARTIFACT_ID.match(artifact_id) is None:
            return False
        try:
            return (self.store.get_artifact(artifact_id, self.tenant) is not None
                    or self.store.get_call_arguments(artifact_id, self.tenant) is not None)
        except EnvelopeError:  # found, sealed under a key this gateway lacks (or changed)
            return True

    def _read(self, artifact_id: str, is_call: bool) -> bytes | str:
        """The raw bytes of an artifact (a call's arguments when `is_call`), or the refusal's text."""
        try:
            if is_call:
                found = self.store.get_call_arguments(artifact_id, self.tenant)
                raw = found[0].encode("utf-8", "surrogatepass") if found is not None else None
            else:
                record = self.store.get_artifact(artifact_id, self.tenant)
                raw = self.store.artifact_bytes(record) if record is not None else None
        except UnknownKey:
            return self._refuse(artifact_id, "encryption_key_unavailable",
                                f"artifact:{artifact_id} cannot be read by the gateway now")
        except (ArtifactCorrupted, BlobCorrupted, FileNotFoundError, EnvelopeError):
            return self._refuse(artifact_id, "artifact_corrupted",
                                f"artifact:{artifact_id} failed its integrity check and cannot be given")
        if raw is None:
            return self._refuse(artifact_id, "not_found", f"no artifact:{artifact_id} in this conversation")
        return raw

    def _lines(self, artifact_id: str, raw: bytes, first: int, last: int | None, *, max_bytes: int,
               max_tokens: int) -> _Given | str:
        """Lines `first`..`last` of the artifact, numbered as its memory numbers them, within bounds."""
        all_lines = raw.decode("utf-8", "replace").split("\n")
        if first > len(all_lines):
            return self._refuse(artifact_id, "invalid_arguments",
                                f"artifact:{artifact_id} has {len(all_lines)} lines; start_line {first} is past its end")
        last = min(last or len(all_lines), len(all_lines))
        part = "\n".join(all_lines[first - 1:last]).encode("utf-8", "surrogatepass")
        body = self._bounded(artifact_id, part, max_bytes, max_tokens)
        self.rehydrations[-1]["lines"] = [first, last]
        return _Given(artifact_id, body, f"lines {first}-{last} of {len(all_lines)}")

    def _policy_refusal(self, view: ArtifactView) -> str | None:
        seen = access(self.policy, view, provider=self.provider, participant=self.participant,
                      subagent_results=self.records.subagent_results)
        if seen.raw:
            return None
        reason = str(seen.reason)
        if reason.startswith("restricted:"):
            privacy = reason.split(":", 1)[1]
            text = f"artifact:{view.artifact_id} is {privacy} and may not be sent to {self.provider}"
        elif reason == "subagent_private":
            text = f"artifact:{view.artifact_id} is a subagent's private result"
        else:  # another participant's: withheld, or shown only as its memory
            reason = "private"
            text = f"artifact:{view.artifact_id} is private to another participant"
        return self._refuse(view.artifact_id, reason, text)

    def _bounded(self, artifact_id: str, raw: bytes, max_bytes: int, max_tokens: int) -> str:
        text = raw.decode("utf-8", "replace")
        tokens = count_text(text)
        if len(raw) <= max_bytes and tokens <= max_tokens:
            self.rehydrations.append({"index": None, "role": "tool", "action": "rehydrated", "reason": "model_request",
                                      "artifact_id": artifact_id, "round": self.rounds, "tokens_after": tokens})
            return text
        # A bounded excerpt: whole characters up to both limits, marked as such.
        cut = min(len(text), max_bytes, max_tokens * 3)
        while cut > 0 and (len(text[:cut].encode()) > max_bytes or count_text(text[:cut]) > max_tokens):
            cut = int(cut * 0.9)
        excerpt = text[:cut]
        self.rehydrations.append({"index": None, "role": "tool", "action": "rehydrated", "reason": "bounded_excerpt",
                                  "artifact_id": artifact_id, "round": self.rounds,
                                  "tokens_after": count_text(excerpt)})
        return (f"{excerpt}\n[{self.name}: excerpt of artifact:{artifact_id}, the first {len(excerpt)} of "
                f"{len(text)} characters ({len(raw)} bytes); the policy bounds rehydration]")
