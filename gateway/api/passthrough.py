"""`POST /v1/embeddings` and `POST /v1/completions`: passed through LiteLLM, recorded, not projected.

They carry no transcript, so nothing is captured or assembled: the request is
checked, its run opened and recorded like any other (usage, cost, latency,
status; the ledger counts it with nothing saved), and the upstream's answer
goes back as it came. `/v1/completions` streams too.
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from gateway.edge.request_id import request_id_of
from gateway.errors import GatewayError, InvalidRequest
from gateway.exchange import Completion, FirstRound
from gateway.pipeline.outcomes import Accounting
from gateway.pipeline.request_path import (
    SESSION_HEADERS,
    check_limits,
    header_value,
    model_for,
    read_body,
    tenant_principal,
)
from gateway.pipeline.run_recorder import RecordedStream, RunRecorder
from gateway.services import Services
from gateway.upstream.seam import UpstreamRequest, closing
from gateway.wire.json_body import check_text, param_path, parse_json_object
from gateway.wire.openai_chat import SSE_DONE, error_body, sse_event
from storage.record_types import RunStart


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class _EmbeddingsBody(_Open):
    model: StrictStr = Field(min_length=1, max_length=256)
    input: StrictStr | list[StrictStr] | list[int] | list[list[int]]


class _CompletionsBody(_Open):
    model: StrictStr = Field(min_length=1, max_length=256)
    prompt: StrictStr | list[StrictStr] | list[int] | list[list[int]]
    stream: StrictBool | None = None
    stream_options: dict[str, Any] | None = None


def _checked(model: type[BaseModel], body: dict[str, Any]) -> BaseModel:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and ("[" in p or p in ("str", "int"))))
        param = param_path(loc)
        raise InvalidRequest(f"{param}: {'is required' if first['type'] == 'missing' else first['msg']}",
                             param=param) from exc


async def handle(request: Request, services: Services, kind: Literal["embeddings", "completions"]) -> Response:
    """One embeddings or completions request, recorded as a run of wire format `openai.<kind>`."""
    principal = await tenant_principal(request, services)
    tenant = principal.tenant
    assert tenant is not None
    body = parse_json_object(await read_body(request, services.settings.server.max_body_bytes))
    checked = _checked(_EmbeddingsBody if kind == "embeddings" else _CompletionsBody, body)
    check_text(checked.model, "model")  # type: ignore[attr-defined]
    model = model_for(services, tenant, checked.model)  # type: ignore[attr-defined]
    stream = kind == "completions" and bool(body.get("stream"))
    headers = await check_limits(services, principal, "requests", 1)
    await services.budgets.check(principal)
    labels = [header_value(request, name) for name in SESSION_HEADERS]
    run = RunStart(request_id=request_id_of(request), tenant=tenant.id,
                   participant=header_value(request, "x-gateway-participant") or principal.key_id,
                   model=checked.model, upstream_model=str(model.litellm_params["model"]),  # type: ignore[attr-defined]
                   stream=stream, session_label=next((label for label in labels if label), None),
                   wire_format=f"openai.{kind}", api_key_id=principal.key_id)
    recorder = RunRecorder(services.store, services.metrics, run, request.scope, budgets=services.budgets)
    upstream = UpstreamRequest(alias=run.model, litellm_params=model.litellm_params,
                               body={k: v for k, v in body.items() if k not in ("model", "stream")},
                               timeout_seconds=services.settings.server.upstream_timeout_seconds,
                               request_id=run.request_id, models_allowed=tenant.allowed_models,
                               attempts=recorder.attempts)
    async with recorder:
        await recorder.open()
        recorder.accounting = Accounting(prices=services.upstream.prices(model.litellm_params), tokens_original=0,
                                         tokens_forwarded=0, previous_original=0)
        recorder.forwarding()
        if stream:
            options = body.get("stream_options") or {}
            return await _stream(services, upstream, recorder, headers, bool(options.get("include_usage")))
        answer = await services.upstream.call(kind, upstream)
        await recorder.succeed(_completion(recorder, answer))
        return JSONResponse(answer, headers=headers)


def _completion(recorder: RunRecorder, answer: dict[str, Any]) -> Completion:
    usage = answer.get("usage") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    assert recorder.accounting is not None
    recorder.accounting = Accounting(prices=recorder.accounting.prices, tokens_original=prompt,
                                     tokens_forwarded=prompt, previous_original=0)
    choices = answer.get("choices") or [{}]
    return Completion(body=answer, usage=usage or None, finish_reason=choices[0].get("finish_reason"))


async def _stream(services: Services, upstream: UpstreamRequest, recorder: RunRecorder,
                  headers: dict[str, str], wants_usage: bool) -> Response:
    """The upstream's chunks as they come; its closing usage chunk (always asked for, so the run is
    recorded with its usage) goes on only if the client asked for it."""
    chunks = FirstRound(services.upstream.stream("completions", upstream))
    await chunks.open()  # an error before the first chunk is an ordinary HTTP error

    async def events() -> AsyncIterator[bytes]:
        text: list[str] = []
        last: dict[str, Any] = {}
        finish = None
        try:
            async with closing(chunks):
                async for chunk in chunks:
                    choices = chunk.get("choices") or []
                    last = {**last, **{k: v for k, v in chunk.items() if v is not None and k != "choices"}}
                    text += [c.get("text") or "" for c in choices]
                    finish = next((c["finish_reason"] for c in choices if c.get("finish_reason")), finish)
                    if choices or wants_usage or not chunk.get("usage"):
                        yield sse_event(chunk)
            answer = {**last, "choices": [{"index": 0, "text": "".join(text), "finish_reason": finish}]}
            await recorder.succeed(_completion(recorder, answer))
            yield SSE_DONE
        except GatewayError as error:
            await recorder.fail(error)
            yield sse_event(error_body(error))
        except Exception as exc:  # a fault of ours mid-stream
            yield sse_event(error_body(await recorder.fail_internally(exc)))

    return RecordedStream(events(), recorder, headers, close=chunks.aclose)
