"""The run recorder: once a run is opened, every exit records how it ended.

The pipeline opens a run when ingest commits it as `pending`; from then on the
recorder owns its outcome. An answer records `ok`; a `GatewayError` records
`error` with its code; any other exception records `internal_error` with the
exception's type; a client that hangs up records `client_disconnected`; a
cancellation records `interrupted`. A streamed answer hands the recorder to
`RecordedStream`, which finishes it whatever happens to the stream. Every
recorder also sits in the request's ASGI scope, and `RunGuard` (the outermost
middleware but one) finishes any left open when the request ends, so not even
a bug in between leaves a run pending. What a crash leaves pending is settled
by `storage.instances` when the next gateway starts.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence

import anyio
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.access.budgets import Budgets
from gateway.errors import GatewayError, InternalError, ServiceUnavailable
from gateway.evaluation.signals import run_signals
from gateway.exchange import Completion
from gateway.ops.metrics import GatewayMetrics
from gateway.pipeline import outcomes
from gateway.pipeline.assembly_bases import RecentAssemblies
from gateway.pipeline.outcomes import Accounting
from gateway.threads import off_loop
from gateway.upstream.seam import Attempt
from policies.transcript import PathNode
from storage.assembly_record import AssemblyRecord
from storage.database import unavailable
from storage.record_types import CapturedThenFailed, IngestResult, RunOutcome, RunStart
from storage.records import RecordStore

log = logging.getLogger("gateway.runs")
_SCOPE_KEY = "run_recorders"
# Outcomes taken but not yet written (answers already on their way to the client): a read of the
# records in this process waits for them, so a client reads what it was just answered.
_WRITING: dict[str, asyncio.Event] = {}


async def outcomes_written() -> None:
    """Wait (bounded) until the outcomes this process has taken are in the store (a dependency of
    every route that reads records)."""
    waiting = [event.wait() for event in list(_WRITING.values())]
    if waiting:
        with anyio.move_on_after(_SETTLE_SECONDS):
            await asyncio.gather(*waiting)


_SETTLE_SECONDS = 10.0


def internal_error(exc: BaseException, recorded: bool, opened: bool = False) -> GatewayError:
    """What the client is told, and the run records, for an exception that is no `GatewayError`: the
    database being away (503), else a fault of the gateway itself (500). It says what the caller knows
    was recorded: the run's outcome, only the run (pending, settled later as interrupted), or nothing."""
    if recorded:
        kept = "the request was recorded and can be retried"
    elif opened:
        kept = "the request's outcome was not recorded; it can be retried"
    else:
        kept = "the request was not recorded and can be retried"
    detail = f"{type(exc).__name__}: {exc}"[:1000]
    if unavailable(exc) is not None:
        return ServiceUnavailable(f"The gateway's database is unavailable; {kept}.", code="storage_unavailable",
                                  detail=detail)
    return InternalError(f"The gateway hit an internal error; {kept}.", detail=detail)


def runs_recorded(scope: Scope) -> tuple[bool, bool]:
    """Whether this request started runs and all have their outcome written; whether one was opened."""
    runs = recorders_of(scope)
    return bool(runs) and all(r.recorded for r in runs), any(r.opened for r in runs)


class RunRecorder:
    """Records one run's outcome exactly once."""

    def __init__(self, store: RecordStore, metrics: GatewayMetrics, start: RunStart, scope: Scope,
                 recent: RecentAssemblies | None = None, budgets: Budgets | None = None,
                 answer_of: Callable[[Mapping[str, Any]], Mapping[str, Any] | None] | None = None) -> None:
        self.store = store
        # The answer as its client sends it back (the wire format's `answer_message`): what moves a run that
        # opened its conversation into the one its answer opens (storage/conversations.py).
        self.answer_of = answer_of
        self.opens_conversation = False  # before any answer: its conversation is its own until this one
        self.budgets = budgets
        self.recent = recent
        self.metrics = metrics
        self.start = start
        self.accounting: Accounting | None = None
        self.assembly: AssemblyRecord | None = None
        self.started = time.perf_counter()
        self.opened = False  # the pending run is committed
        self.finished = False
        self.recorded = False  # its outcome is written (what an answer may claim)
        self.outcome: RunOutcome | None = None  # as recorded (the access log reads it)
        self.streaming = False  # handed to a RecordedStream, which finishes it
        self.attempts: list[Attempt] = []  # every upstream try (gateway/upstream/deployments.py), the answer last
        # The request's neutral transcript, when it has one: an answer's outcome signals are read from it.
        self.transcript: Sequence[Mapping[str, Any]] | None = None
        self.answer: Mapping[str, Any] | None = None  # the answer, as its client sends it back
        # Called once an answer's outcome is written (the client has had it): a shadow comparison starts there.
        self.on_answered: Callable[[RunOutcome, Mapping[str, Any] | None], None] | None = None
        scope.setdefault("state", {}).setdefault(_SCOPE_KEY, []).append(self)

    async def ingest(self, path: Sequence[PathNode]) -> IngestResult:
        """Capture the request and open its run (durably, before anything is forwarded)."""
        return await off_loop(self.ingest_here, path)

    def ingest_here(self, path: Sequence[PathNode]) -> IngestResult:
        """`ingest` on the calling thread (a worker thread: it waits for the store)."""
        try:
            result = self.store.ingest(path, self.start)
        except CapturedThenFailed:
            self.opened = True  # the run is stored, pending: every exit from here records its outcome
            raise
        self.opened = True
        self.opens_conversation = result.conversation_id == self.start.request_id
        return result

    async def open(self) -> None:
        """Open a run that carries no transcript (embeddings, completions): recorded as pending first."""
        await off_loop(self.store.open_run, self.start)
        self.opened = True

    def forwarding(self) -> None:
        """The run's latency counts from here: the upstream's time, hidden rounds included."""
        self.started = time.perf_counter()

    async def finish(self, outcome: RunOutcome) -> None:
        if self.finished or not self.opened:
            self._written()
            return
        self.finished = True
        outcome = self._with_attempts(outcome)
        self.outcome = outcome
        try:
            with anyio.CancelScope(shield=True):  # a cancelled request still records its end
                self.recorded = await off_loop(self.store.finish_run, self.start.request_id, outcome, self.assembly)
        except Exception as exc:  # the store is down: the run stays pending until the next start settles it
            why = unavailable(exc)
            if why is None:
                log.exception("could not record the outcome of run %s", self.start.request_id)
            else:
                log.error("could not record the outcome of run %s: the database is unavailable (%s)",
                          self.start.request_id, why)
        else:
            if self.recorded:  # False: the run already had a real outcome (counted when that was written)
                self.metrics.observe_run(self.start.tenant, self.start.model, outcome, self.assembly,
                                         self.start.evaluation_arm)
            if self.recorded and self.budgets is not None and outcome.cost_usd:
                with anyio.CancelScope(shield=True):
                    await self.budgets.spend(self.start.tenant, self.start.api_key_id, outcome.cost_usd,
                                             self.start.started_at)
            if self.recent is not None and self.assembly is not None:
                self.recent.remember(self.start.request_id, self.assembly)
            if self.recorded and self.on_answered is not None and outcome.status == "ok":
                self.on_answered(outcome, self.answer)
        finally:
            self._written()

    def _written(self) -> None:
        event = _WRITING.pop(self.start.request_id, None)
        if event is not None:
            event.set()

    def success(self, completion: Completion) -> RunOutcome:
        """The outcome of an answer, as of now (its latency stops here); reads of the records wait
        for it until it is written."""
        assert self.accounting is not None
        _WRITING.setdefault(self.start.request_id, asyncio.Event())
        accounting = self.accounting
        answered = self.answered()
        if answered is not None and answered.prices is not None and answered.prices != accounting.prices:
            accounting = replace(accounting, prices=answered.prices)  # a deployment priced otherwise answered
        outcome = outcomes.success(completion, self.started, accounting)
        if self.assembly is not None and self.assembly.provider_edits:
            self.assembly.provider_edits["applied_edits"] = completion.applied_edits
        answer = self.answer = self.answer_of(completion.body) if self.answer_of is not None else None
        if self.opens_conversation and answer is not None:
            outcome = replace(outcome, answer=answer)
        if self.transcript is not None and self.answer_of is not None:
            rehydrations = self.assembly.rehydrations if self.assembly is not None else ()
            outcome = replace(outcome, signals=run_signals(self.transcript, answer, rehydrations))
        return outcome

    def answered(self) -> Attempt | None:
        """The try that answered (the last one, when it succeeded)."""
        return self.attempts[-1] if self.attempts and self.attempts[-1].outcome == "ok" else None

    def _with_attempts(self, outcome: RunOutcome) -> RunOutcome:
        if not self.attempts:
            return outcome
        last = self.attempts[-1]
        return replace(outcome, deployment=last.deployment, upstream_model=last.upstream_model,
                       attempts=tuple(a.record() for a in self.attempts))

    async def succeed(self, completion: Completion) -> None:
        await self.finish(self.success(completion))

    async def fail(self, error: GatewayError, status: str = "error") -> None:
        await self.finish(outcomes.failure(error, self.started, self.accounting, status=status))

    async def fail_internally(self, exc: Exception) -> GatewayError:
        """Record `exc` as the run's fault; what to tell the client (whether the outcome was written)."""
        await self.fail(internal_error(exc, recorded=True), status="internal_error")
        return internal_error(exc, self.recorded, self.opened)

    async def end_for(self, exc: BaseException | None, *, streaming: bool = False) -> None:
        """The outcome an exception (or none at all) implies, if no other was recorded."""
        if self.finished or not self.opened:
            return
        hung_up = exc is None or isinstance(exc, (ClientDisconnect, OSError))  # a stream's send failed
        if isinstance(exc, GatewayError):
            await self.fail(exc)
        elif isinstance(exc, (asyncio.CancelledError, GeneratorExit)) or (streaming and hung_up):
            status = "client_disconnected" if streaming else "interrupted"
            message = "the client closed the stream" if streaming else "the request was cancelled"
            await self.fail(GatewayError(message, code=status), status=status)
        elif isinstance(exc, Exception):
            await self.fail_internally(exc)
        else:
            error = GatewayError("the request ended without recording an outcome", code="interrupted")
            await self.fail(error, status="interrupted")

    async def __aenter__(self) -> "RunRecorder":
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None and not self.streaming:
            await self.end_for(exc)
        return False


def open_recorders(scope: Scope) -> list[RunRecorder]:
    return [r for r in scope.get("state", {}).get(_SCOPE_KEY, ()) if r.opened and not r.finished]


def recorders_of(scope: Scope) -> list[RunRecorder]:
    """Every run this request started."""
    return list(scope.get("state", {}).get(_SCOPE_KEY, ()))


class RecordedStream(StreamingResponse):
    """A streamed answer whose run is finished, and whose upstream stream is closed, however it ends.

    `events` closes the upstream streams it opens; `close` closes the one opened before it (the first
    round, opened to answer its errors as plain HTTP errors), which `events` never reaches if the
    response ends before it starts.
    """

    def __init__(self, events: AsyncIterator[bytes], recorder: RunRecorder, headers: Mapping[str, str],
                 close: Callable[[], Awaitable[None]] | None = None, media_type: str = "text/event-stream") -> None:
        recorder.streaming = True
        self.recorder = recorder
        self.close_upstream = close
        super().__init__(events, media_type=media_type,
                         headers={"cache-control": "no-cache", "x-accel-buffering": "no", **headers})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        failure: BaseException | None = None
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect as exc:  # the client went away: nothing left to answer
            failure = exc
        except BaseException as exc:
            failure = exc
            raise
        finally:
            with anyio.CancelScope(shield=True):
                close = getattr(self.body_iterator, "aclose", None)
                if close is not None:
                    try:
                        await close()  # stops the upstream stream it was reading
                    except Exception:
                        log.exception("closing the stream of run %s", self.recorder.start.request_id)
                if self.close_upstream is not None:
                    await self.close_upstream()
                await self.recorder.end_for(failure, streaming=True)


class RecordedAnswer(JSONResponse):
    """A whole answer, sent before its outcome is written: the client does not wait for the store.

    The outcome is taken when the answer is ready and written after the last byte is sent (or the
    send failed), shielded from cancellation; a crash in between leaves the run pending, and the
    next start settles it as interrupted. Its artifacts were durable before anything was forwarded.
    """

    def __init__(self, body: Any, recorder: RunRecorder, outcome: RunOutcome, headers: Mapping[str, str]) -> None:
        self.recorder, self.outcome = recorder, outcome
        super().__init__(body, headers=dict(headers))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.recorder.finish(self.outcome)


class RunGuard:
    """Plain ASGI middleware: no run outlives its request without an outcome."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        failure: BaseException | None = None
        try:
            await self.app(scope, receive, send)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            for recorder in open_recorders(scope):
                await recorder.end_for(failure, streaming=recorder.streaming)
