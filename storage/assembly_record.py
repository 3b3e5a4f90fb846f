"""A context assembly as the store takes it and gives it back (`AssemblyRecord`), and how its decisions
are stored: a request stores only what differs from its base request's decisions on the same path (at
least whole every `MAX_BASE_DEPTH` requests), each replacement named by the digest of what was
forwarded, and a reader restores the rest (`merged_decisions`, `full_decisions`).

Between epochs an agent's request stores its new round's decisions, not its whole transcript's again.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from typing import Any, Iterator, Mapping

from policies.assembly_types import Decision
from policies.bounded_cache import BoundedCache
from policies.canonical import fast_canonical_json
from storage.schema import ContextAssembly


@dataclass(frozen=True)
class AssemblyRecord:
    """A ContextAssembly as the gateway hands it to the store (plain values only).

    Its decisions (`decisions`: one per message, then the rehydrations) are held as they come: a fresh
    assembly's per-message ones as the assembler's `Decision`s (`decided`), a record read back from its
    row's as dicts (`restored`). The request path makes dicts only of the notable ones (`notable`):
    most of a request's messages are `verbatim`, which nothing stores."""

    policy_name: str
    policy_version: str
    assembler_version: str
    tokens_original: int
    tokens_forwarded: int
    messages_original: int
    messages_forwarded: int
    boundary_round: int
    epoch_round: int
    omissions: dict[str, int]
    timings_ms: dict[str, float]
    decided: tuple[Decision, ...] = ()  # one per message, as assembled (a fresh assembly)
    restored: list[dict[str, Any]] | None = None  # one per message, as read back (then `decided` is empty)
    # The rehydrations (`index` None), in order: the request's Rehydrator appends them as they happen.
    rehydrations: list[dict[str, Any]] = field(default_factory=list)
    parent_request_id: str | None = None
    # What was forwarded in place of a client's message, by message index: stored once per
    # conversation and named from its decision by digest. Messages forwarded as the client sent
    # them are not stored again: the projection is rebuilt from the path and these.
    replaced: dict[int, dict[str, Any]] | None = None
    # The earlier request on this path whose stored decisions this one's extend (None: stored whole),
    # and those decisions as the gateway still holds them: only what differs is stored.
    base_request_id: str | None = None
    base_decisions: Mapping[int, dict[str, Any]] | None = None
    # The previous request's replacements on this path with their digests, by message index, as the
    # gateway still holds them (`forwarded`): a message forwarded again in its place is not hashed again.
    earlier_forwarded: Mapping[int, tuple[Mapping[str, Any], str]] | None = None
    # The provider's own context edits (Anthropic's `context_management`): `edits` as the client asked
    # them, `applied_edits` as the answer reported them (None: it reported none); empty when none were
    # asked. Filled in as the request goes, like `rehydrations`; stored after them (`CONTEXT_MANAGEMENT`).
    provider_edits: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def forwarded(self) -> dict[int, tuple[Mapping[str, Any], str]]:
        """Each replacement with its digest (`message_digest`), by message index (worked out once per record)."""
        return _forwarded(self)

    @cached_property
    def notable(self) -> dict[int, dict[str, Any]]:
        """The decisions a reader cannot restore, by message index (worked out once per record)."""
        return self._notable_and_changed[0]

    @cached_property
    def changed(self) -> list[int]:
        """The indices of `notable` whose dict is not its base's own (all of them without a base): where
        it may differ from the base. Between epochs, the new round's."""
        return self._notable_and_changed[1]

    @cached_property
    def _notable_and_changed(self) -> tuple[dict[int, dict[str, Any]], list[int]]:
        return _notable(self)

    @property
    def decisions(self) -> list[dict[str, Any]]:
        """One decision per message, then the rehydrations: a new list of dicts on every read (the records
        API, the dashboard); the request path reads `notable` and `rehydrations` instead."""
        per_message = self.restored if self.restored is not None else [d.as_dict() for d in self.decided]
        return per_message + self.rehydrations

    def as_dict(self) -> dict[str, Any]:
        decisions = self.decisions
        return {
            "object": "context_assembly",
            "policy": {"name": self.policy_name, "version": self.policy_version},
            "assembler_version": self.assembler_version,
            "tokens": {"original": self.tokens_original, "forwarded": self.tokens_forwarded},
            "messages": {"original": self.messages_original, "forwarded": self.messages_forwarded},
            "epoch": {"boundary_round": self.boundary_round, "epoch_round": self.epoch_round},
            "omissions": self.omissions,
            "decisions": decisions,
            "rehydrations": sum(1 for d in decisions if d["action"] == "rehydrated"),
            "timings_ms": self.timings_ms,
            "links": {"parent_request_id": self.parent_request_id},
            "context_management": dict(self.provider_edits) if self.provider_edits else None,
        }


# Keyed by the message's strings, holding its canonical bytes: at most 32 MB of them (a verbatim
# result may be megabytes).
_DIGESTS = BoundedCache(8192, max_weight=32 * 1024 * 1024, weigh=lambda found: 2 * len(found[1]))


def message_digest(message: dict[str, Any]) -> tuple[str, bytes]:
    """(digest, canonical bytes) of a forwarded message.

    A memory is the same text on every request of its conversation (the assembler hands back the
    same string), so the digests of messages of plain strings are kept for a while."""
    key = tuple(sorted(message.items())) if all(type(v) is str for v in message.values()) else None
    found = _DIGESTS.get(key) if key is not None else None
    if found is None:
        data = fast_canonical_json(message).encode("utf-8", "surrogatepass")
        found = hashlib.sha256(data).hexdigest(), data
        if key is not None:
            _DIGESTS.put(key, found)
    return found


# The entry after a request's stored decisions that holds its provider edits (`AssemblyRecord.provider_edits`).
CONTEXT_MANAGEMENT = "context_management"
MAX_BASE_DEPTH = 32  # a request stores its decisions whole at least every this many requests of a path


def _forwarded(record: AssemblyRecord) -> dict[int, tuple[Mapping[str, Any], str]]:
    """The record's replacements with their digests: the earlier request's digest where it forwarded an
    equal message in the same place (memories are the same from request to request: the assembler
    hands back the same strings, so the comparison is mostly by identity), else `message_digest`."""
    earlier = record.earlier_forwarded or {}
    out = {}
    for index, message in (record.replaced or {}).items():
        known = earlier.get(index)
        if known is not None and (known[0] is message or known[0] == message):
            out[index] = known
        else:
            out[index] = message, message_digest(message)[0]
    return out


def _notable(record: AssemblyRecord) -> tuple[dict[int, dict[str, Any]], list[int]]:
    """Every decision but `verbatim` (a reader restores those) by message index, each that replaced
    its message naming the replacement's digest.

    A decision equal to its base's is the base's own dict: the gateway holds the notable decisions of
    thousands of recent requests (gateway/pipeline/assembly_bases.py), and between epochs a request's are its
    base's plus the new round's, so held alike they cost the memory and the collector's passes of one
    request's, not of every request's (these dicts are never changed once made). A fresh assembly's
    decision taken again from the request before (policies/decision_reuse.py: the same `Decision`
    instance) gives the dict made for it then, without making and comparing another (`_dict_of`)."""
    base = record.base_decisions if record.base_request_id is not None else None
    out, changed = {}, []
    for index, made in _made_notable(record):
        if base is not None:
            held = base.get(index)
            if held is not None and held is not made and held == made:
                made = held
            if held is not made:
                changed.append(index)
        out[index] = made
    return out, changed if base is not None else list(out)


def _made_notable(record: AssemblyRecord) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index, decision) of each per-message decision but `verbatim`, as a dict naming the digest of
    what replaced its message: a record read back has its dicts already, a fresh assembly's are made
    only for these (a request's messages are mostly `verbatim`), once per `Decision` (`_dict_of`)."""
    forwarded = record.forwarded
    if record.restored is not None:
        for decision in record.restored:
            index = decision.get("index")
            if index is not None and decision.get("action") != "verbatim":
                yield index, {**decision, "forwarded": forwarded[index][1]} if index in forwarded else decision
        return
    for decision in record.decided:
        if decision.action != "verbatim":
            index = decision.index
            yield index, _dict_of(decision, forwarded[index][1] if index in forwarded else None)


def _dict_of(decision: Decision, digest: str | None) -> dict[str, Any]:
    """`decision` as a notable dict naming the digest of what replaced its message (None: nothing did),
    made once per `Decision` instance and digest: kept on the (frozen) instance, beside its fields (not
    one of them: equality and hashing do not see it)."""
    found = decision.__dict__.get("_as_notable")
    if found is not None and found[0] == digest:
        return found[1]
    made = decision.as_dict()
    if digest is not None:
        made["forwarded"] = digest
    object.__setattr__(decision, "_as_notable", (digest, made))
    return made


def stored_decisions(record: AssemblyRecord) -> list[dict[str, Any]]:
    """What a request stores of its decisions: those that differ from its base request's (all of
    them without a base; a message verbatim again after a base's decision is stored as such), and
    its rehydrations. Between epochs that is the new round's: it does not grow with the transcript."""
    notable = record.notable
    base = record.base_decisions if record.base_request_id is not None else None
    if base is None:
        out = list(notable.values())
    else:
        # the decisions not in `changed` are the base's own dicts
        out = [notable[i] for i in record.changed if not _same_decision(base.get(i), notable[i])]
        out += [{"index": i, "role": base[i].get("role"), "action": "verbatim", "reason": "kept",
                 "artifact_id": None} for i in base.keys() - notable.keys()]
    edits = [{"index": None, "action": CONTEXT_MANAGEMENT, **record.provider_edits}] if record.provider_edits else []
    return sorted(out, key=lambda d: d["index"]) + list(record.rehydrations) + edits


def _epochless(decision: Mapping[str, Any]) -> Mapping[str, Any]:
    """A decision without the epoch its reason names (`epoch:500`): every memory of a projection
    names the projection's own epoch, so a move of the epoch changes no memory's record."""
    reason = decision.get("reason")
    if isinstance(reason, str) and _EPOCH_REASON.fullmatch(reason):
        return {**decision, "reason": "epoch"}
    return decision


def _same_decision(base: Mapping[str, Any] | None, decision: Mapping[str, Any]) -> bool:
    return base is not None and (base is decision or base == decision or _epochless(base) == _epochless(decision))


_EPOCH_REASON = re.compile(r"epoch:\d+")


def assembly_to_row(request_id: str, tenant: str, record: AssemblyRecord) -> dict[str, Any]:
    """The `context_assemblies` row of a recorded assembly, as column values."""
    return dict(
        request_id=request_id,
        tenant=tenant,
        policy_name=record.policy_name,
        policy_version=record.policy_version,
        assembler_version=record.assembler_version,
        tokens_original=record.tokens_original,
        tokens_forwarded=record.tokens_forwarded,
        messages_original=record.messages_original,
        messages_forwarded=record.messages_forwarded,
        boundary_round=record.boundary_round,
        epoch_round=record.epoch_round,
        decisions_json=json.dumps(stored_decisions(record), separators=(",", ":")),
        omissions_json=json.dumps(record.omissions, separators=(",", ":")),
        timings_json=json.dumps(record.timings_ms, separators=(",", ":")),
        parent_request_id=record.parent_request_id,
        base_request_id=record.base_request_id,
        forwarded_zlib=None,
        created_at=datetime.now(timezone.utc),
    )


def merged_decisions(chain: list[ContextAssembly]) -> dict[int, dict[str, Any]]:
    """A request's decisions by message index from its stored ones and its bases' (`chain`: the
    request first, then its base, and so on): the nearest wins; `verbatim` ones dropped."""
    merged: dict[int, dict[str, Any]] = {}
    epoch = f"epoch:{chain[0].epoch_round}"  # the reason of the request's every memory (`_epochless`)
    for depth, row in enumerate(chain):
        for decision in json.loads(row.decisions_json):
            index = decision.get("index")
            if index is not None and index < chain[0].messages_original and index not in merged:
                if depth and _EPOCH_REASON.fullmatch(str(decision.get("reason"))):
                    decision = {**decision, "reason": epoch}
                merged[index] = decision
    return {i: d for i, d in merged.items() if d.get("action") != "verbatim"}


def full_decisions(notable: Mapping[int, dict[str, Any]], roles: list[str]) -> list[dict[str, Any]]:
    """One decision per message: the notable ones, and `verbatim` for every other message."""
    return [notable.get(i) or {"index": i, "role": role, "action": "verbatim", "reason": "kept", "artifact_id": None}
            for i, role in enumerate(roles)]


def assembly_from_row(row: ContextAssembly, roles: list[str] | None = None,
                      chain: list[ContextAssembly] | None = None) -> AssemblyRecord:
    """The record of `row`; `chain` (the row and its bases) and the path's `roles` restore the
    decisions it did not store (recorded whole before migration 0005, they need neither). The
    rehydrations are stored after the per-message decisions, as they were made."""
    stored = json.loads(row.decisions_json)
    managed = next((d for d in stored if d.get("index") is None and d.get("action") == CONTEXT_MANAGEMENT), None)
    stored = [d for d in stored if d is not managed]
    rehydrations = [d for d in stored if d.get("index") is None]
    if roles is not None and row.forwarded_zlib is None:
        restored = full_decisions(merged_decisions(chain or [row]), roles)
    else:
        restored = [d for d in stored if d.get("index") is not None]
    return AssemblyRecord(
        policy_name=row.policy_name,
        policy_version=row.policy_version,
        assembler_version=row.assembler_version,
        tokens_original=row.tokens_original,
        tokens_forwarded=row.tokens_forwarded,
        messages_original=row.messages_original,
        messages_forwarded=row.messages_forwarded,
        boundary_round=row.boundary_round,
        epoch_round=row.epoch_round,
        restored=restored,
        rehydrations=rehydrations,
        omissions=json.loads(row.omissions_json),
        timings_ms=json.loads(row.timings_json),
        parent_request_id=row.parent_request_id,
        provider_edits={k: v for k, v in managed.items() if k not in ("index", "action")} if managed else {},
    )
