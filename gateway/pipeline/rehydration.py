"""The rehydration tool: the model asks for an artifact's exact bytes, the gateway answers.

The tool is added to a request when its projection holds compacted artifacts
and the client sent `tools`. Calls to it are answered here, never by the
client: the answer is checked against the tenant, the request's lineage, the
provider's privacy rules, participant visibility and subagent boundaries, and
bounded in bytes and tokens. Every answer, given or refused, is a decision in
the request's assembly record.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
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

_ARTIFACT_ID = re.compile(r"^(?:art|args)_[0-9a-f]{1,64}$")
DESCRIPTION = "Exact content of artifact:<id>; lines: an optional range such as 120-160."


PARAMETERS = {"type": "object", "properties": {"artifact_id": {"type": "string"}, "lines": {"type": "string"}},
              "required": ["artifact_id"]}
_RANGE = re.compile(r"^\s*(\d+)\s*(?:(-)\s*(\d+)?)?\s*$")


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
    _views: dict[str, ArtifactView] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._views = {v.artifact_id: v for v in self.records.artifacts.values()}
        self._lineage = self.records.lineage()
        # Memories name artifacts by short references (policies.transcript.short_ref): this path's resolve here.
        self._by_ref = {short_ref(artifact_id): artifact_id for artifact_id in self._lineage}

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

    def answer(self, call: Mapping[str, Any]) -> str:
        """The tool message content for one call (runs in a worker thread: it reads the store)."""
        try:
            if "function" in call:
                arguments = json.loads((call.get("function") or {}).get("arguments") or "{}")
            else:  # an Anthropic tool_use block
                arguments = call.get("input")
            artifact_id = self.full_id(str(arguments["artifact_id"]).strip().removeprefix("artifact:"))
        except (ValueError, KeyError, TypeError, AttributeError):
            return self._refuse(None, "invalid_arguments", 'pass {"artifact_id": "<id after artifact:>"}')
        try:
            lines = _line_range(arguments)
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
        answer = self._lines(artifact_id, raw, *lines) if lines is not None else self._bounded(artifact_id, raw)
        if redacted and self.rehydrations[-1]["action"] == "rehydrated":
            self.rehydrations[-1]["redacted"] = dict(redacted)
        return answer

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

    def _lines(self, artifact_id: str, raw: bytes, first: int, last: int | None) -> str:
        """Lines `first`..`last` of the artifact, numbered as its memory numbers them, within bounds."""
        all_lines = raw.decode("utf-8", "replace").split("\n")
        if first > len(all_lines):
            return self._refuse(artifact_id, "invalid_arguments",
                                f"artifact:{artifact_id} has {len(all_lines)} lines; start_line {first} is past its end")
        last = min(last or len(all_lines), len(all_lines))
        part = "\n".join(all_lines[first - 1:last]).encode("utf-8", "surrogatepass")
        body = self._bounded(artifact_id, part)
        self.rehydrations[-1]["lines"] = [first, last]
        return f"[{self.name}: artifact:{artifact_id} lines {first}-{last} of {len(all_lines)}]\n{body}"

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

    def _bounded(self, artifact_id: str, raw: bytes) -> str:
        limits = self.policy.rehydration
        text = raw.decode("utf-8", "replace")
        tokens = count_text(text)
        if len(raw) <= limits.max_bytes and tokens <= limits.max_tokens:
            self.rehydrations.append({"index": None, "role": "tool", "action": "rehydrated", "reason": "model_request",
                                      "artifact_id": artifact_id, "round": self.rounds, "tokens_after": tokens})
            return text
        # A bounded excerpt: whole characters up to both limits, marked as such.
        cut = min(len(text), limits.max_bytes, limits.max_tokens * 3)
        while cut > 0 and (len(text[:cut].encode()) > limits.max_bytes or count_text(text[:cut]) > limits.max_tokens):
            cut = int(cut * 0.9)
        excerpt = text[:cut]
        self.rehydrations.append({"index": None, "role": "tool", "action": "rehydrated", "reason": "bounded_excerpt",
                                  "artifact_id": artifact_id, "round": self.rounds,
                                  "tokens_after": count_text(excerpt)})
        return (f"{excerpt}\n[{self.name}: excerpt of artifact:{artifact_id}, the first {len(excerpt)} of "
                f"{len(text)} characters ({len(raw)} bytes); the policy bounds rehydration]")
