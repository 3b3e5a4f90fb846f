"""A run's outcome: how it ended, and the record of its assembly (the other half of a run's record,
after storage/capture.py opened it). A run that opened its conversation moves into the one its answer
opens (storage/conversations.py)."""
from __future__ import annotations

import zlib
from typing import Any

from sqlalchemy import Connection, bindparam, func, insert, or_, update

from policies.canonical import fast_canonical_json
from policies.transcript import opening_conversation_id
from storage.assembly_record import AssemblyRecord, assembly_to_row, message_digest
from storage.conversations import Conversations
from storage.encryption import forwarded_aad, run_error_aad, run_response_aad
from storage.record_types import SIGNALS, RunOutcome
from storage.schema import ContextAssembly, ForwardedMessage, ModelRun

_RUNS = ModelRun.__table__
# How a run ended, built once: a value left None (deployment, upstream model, attempts) keeps the row's.
_KEPT_UNLESS_GIVEN = ("deployment", "upstream_model", "attempts_json")
_FINISH_RUN = (
    update(_RUNS)
    .where(_RUNS.c.id == bindparam("request_id"), or_(_RUNS.c.status == "pending", _RUNS.c.status == "interrupted"))
    .values({
        **{name: bindparam(name) for name in (
            "status", "latency_ms", "http_status", "error_type", "error_message", "prompt_tokens",
            "completion_tokens", "cached_tokens", "total_tokens", "cost_usd", "cost_original_usd",
            "tokens_original", "tokens_forwarded", "cache_write_tokens", "finish_reason", "response_json",
            "key_id", "finished_at", *SIGNALS)},
        **{name: func.coalesce(bindparam(name, type_=_RUNS.c[name].type), _RUNS.c[name]) for name in _KEPT_UNLESS_GIVEN},
    })
    .returning(_RUNS.c.tenant, _RUNS.c.conversation_id, _RUNS.c.leaf_node_id)
)
_INSERT_ASSEMBLY = insert(ContextAssembly.__table__)


class RunOutcomes(Conversations):
    def finish_run(
        self, request_id: str, outcome: RunOutcome, assembly: AssemblyRecord | None = None
    ) -> bool:
        """Record how a run ended. Once only; but a real outcome replaces `interrupted` (a guess). Whether
        this outcome was written (False: the run is not there, or has a real outcome already)."""
        values: dict[str, Any] = {
            "request_id": request_id,
            "status": outcome.status,
            "latency_ms": outcome.latency_ms,
            "http_status": outcome.http_status,
            "error_type": outcome.error_type,
            "error_message": self.encryption.seal_text(outcome.error_message, run_error_aad(request_id)),
            "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "cached_tokens": outcome.cached_tokens,
            "total_tokens": outcome.total_tokens,
            "cost_usd": outcome.cost_usd,
            "cost_original_usd": outcome.cost_original_usd,
            "tokens_original": outcome.tokens_original,
            "tokens_forwarded": outcome.tokens_forwarded,
            "cache_write_tokens": outcome.cache_write_tokens,
            "finish_reason": outcome.finish_reason,
            "response_json": self.encryption.seal_text(
                fast_canonical_json(outcome.response) if outcome.response else None, run_response_aad(request_id)),
            "key_id": self.encryption.current_id,
            "finished_at": self._now(),
            "deployment": outcome.deployment,
            "upstream_model": outcome.upstream_model,
            "attempts_json": fast_canonical_json(list(outcome.attempts)) if len(outcome.attempts) > 1 else None,
        }
        signals = outcome.signals or {}
        values |= {name: signals.get(name) for name in SIGNALS}
        # What the assembly stores is worked out before the write lock is taken (SQLite: one writer).
        replaced = self._replacements(assembly) if assembly is not None else []
        assembly_row = assembly_to_row(request_id, "", assembly) if assembly is not None else None

        def write(connection: Connection) -> bool:
            finished = self._execute(connection, _FINISH_RUN, values)
            if not finished:
                return False
            tenant, conversation, leaf = finished[0]
            if outcome.answer is not None and conversation == request_id and leaf != request_id:
                conversation = opening_conversation_id(tenant, leaf, outcome.answer)
                self._adopt_first_run(connection, tenant, request_id, conversation)
            if assembly_row is not None:
                with self._batched(connection, last=True):  # PostgreSQL: one round trip for both, and COMMIT
                    self._insert_ignoring_conflicts(connection, ForwardedMessage, [
                        {**row, "conversation_id": conversation or request_id, "tenant": tenant} for row in replaced])
                    self._execute(connection, _INSERT_ASSEMBLY, [{**assembly_row, "tenant": tenant}])
            return True

        return self._in_transaction(write, folded=True)

    def _replacements(self, assembly: AssemblyRecord) -> list[dict[str, Any]]:
        """The messages forwarded in place of the client's, stored once per conversation (most are there
        already: between epochs a request forwards the same memories as the one before), as rows
        without their conversation and tenant."""
        rows = {}
        base = assembly.base_decisions if assembly.base_request_id is not None else None
        notable = assembly.notable
        now = self._now()
        replaced = assembly.replaced or {}
        # Where the decision is its base's own dict, the base forwarded the same message (`changed`).
        for index in replaced if base is None else [i for i in assembly.changed if i in replaced]:
            message, forwarded = replaced[index], notable[index].get("forwarded")
            if base is not None and forwarded is not None and (base.get(index) or {}).get("forwarded") == forwarded:
                continue  # the base request forwarded the same message: stored then
            digest, data = message_digest(message)
            sealed, key_id = self.encryption.seal_if_enabled(zlib.compress(data), forwarded_aad(digest))
            rows[digest] = {"digest": digest, "message_zlib": sealed, "key_id": key_id, "created_at": now}
        return list(rows.values())
